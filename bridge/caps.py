"""What one engine's endpoints can make the bridge hold or do, whoever answers there.

The bridge's SUB and replay DEALER sockets connect to addresses an operator names, but the
bytes that come back are anyone's (a process that took the port while the engine restarted,
anything on the path, one hostile engine of a fleet): and one bridge process serves every
engine of its fleet on one event loop and one heap. So every input is bounded:

- ``MAX_MESSAGE_BYTES``: ``ZMQ_MAXMSGSIZE`` of every bridge socket (per frame: libzmq drops
  the connection of a peer that announces a larger frame, before reading it). A vLLM step's
  batch is tens of KiB (a 128k-token prefill in one step is ~400 KiB); 16 MiB is room for
  any real step and bounds what one message can cost.
- ``MAX_BATCH_BLOCKS``: block hashes plus events in one batch; a batch past it is malformed
  (the engine's state is cleared, the index hears ``cleared``). A 10 MB batch of stored
  blocks holds ~175,000; a real step a few thousand.
- ``REPLAY_BATCHES`` / ``REPLAY_BYTES``: one replay request keeps at most this many replies
  and bytes (vLLM buffers 10,000 batches); past either the replay is cut short, applied as
  far as it goes and resumed from there (``bridge.replay``), as for replies the engine's
  ROUTER dropped. A peer that never sends the end marker costs at most one cap at a time.
- ``SLICE_BYTES`` / ``SLICE_BLOCKS``: a payload larger than ``SLICE_BYTES`` is applied in
  slices of at most ``SLICE_BLOCKS`` blocks (``bridge.batch_slices``), the subscriber giving
  the loop a turn between slices once its ``TURN_S`` is spent, so one engine's large batch
  delays the others' ingest (and the loop watchdog the heartbeats read) by a slice, never
  by the batch (a slice is ~5 ms at the bridge's 200,000 blocks/s). Each block is at least
  one byte of payload, so a payload under ``SLICE_BYTES`` is at most that many blocks: a
  few milliseconds of work, applied whole (the hot path, unchanged). The payload's decode
  is the one step not sliced: ~0.1 s for 14 MB on a loaded 2-core host, bounded by
  ``MAX_MESSAGE_BYTES``, far inside the liveness bound (the service's 3 s by default).
"""
from __future__ import annotations

from kvmesh.events.vllm import REPLAY_BUFFER

MAX_MESSAGE_BYTES = 16 << 20
MAX_BATCH_BLOCKS = 1 << 18
REPLAY_BATCHES = REPLAY_BUFFER
REPLAY_BYTES = 64 << 20
SLICE_BYTES = 64 << 10
SLICE_BLOCKS = 1024
