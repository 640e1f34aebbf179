"""What one engine's endpoints can make the bridge hold or do, whoever answers there.

The bytes that come back are anyone's and one process serves a whole fleet, so every input is
bounded: the frame size (``MAX_MESSAGE_BYTES``), the blocks of one batch (``MAX_BATCH_BLOCKS``),
one replay (``REPLAY_BATCHES``/``REPLAY_BYTES``), and the slice a large batch is applied in
(``SLICE_BYTES``/``SLICE_BLOCKS``).

See docs/architecture.md#bridge-ingest-and-recovery.
"""
from __future__ import annotations

from kvmesh.events.vllm import REPLAY_BUFFER

MAX_MESSAGE_BYTES = 16 << 20
MAX_BATCH_BLOCKS = 1 << 18
REPLAY_BATCHES = REPLAY_BUFFER
REPLAY_BYTES = 64 << 20
SLICE_BYTES = 64 << 10
SLICE_BLOCKS = 1024
