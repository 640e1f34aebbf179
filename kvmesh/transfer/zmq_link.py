"""Receiver-side connections of the zmq and shm planes: one DEALER per source, shared.

A pull's fixed cost is mostly the connection (TCP and ZMTP handshakes, a few thread hops),
so a receiver keeps one :class:`Link` per source address and event loop, reused by every
pull to that source and shared by concurrent ones: the source tags each message with its
offer key and the link's reader hands it to that pull's queue. A link idle for ``IDLE_S``
closes itself.

A socket monitor watches the connection: a source that goes away (process closed or killed:
the TCP connection ends) fails every pull on the link with "closed" at once, after the frames
that had already arrived (``GRACE_S``); a source not listening at all fails them with
"unreachable" at once (the caller falls back to recompute without waiting out its deadline).
Either way the link is dropped and the next pull connects afresh.

A source whose endpoint names a CURVE key gets a CURVE link (this process's own key pair, drawn
once, and the source's public key from the endpoint): a handshake that fails (someone else
answering at that address, a source that does not encrypt) fails the pulls with "refused" at
once. Links are per (address, key): a restarted source with a new key gets a new one.

See docs/architecture.md#peer-kv-transfer-the-data-plane.
"""
from __future__ import annotations

import asyncio
import contextlib
import functools
import weakref

import zmq
import zmq.asyncio
from zmq.utils import z85
from zmq.utils.monitor import parse_monitor_message

from kvmesh.transfer.frames import HEAD, KEY_BYTES, MAGIC, TransferError

IDLE_S = 30.0
GRACE_S = 0.02
_HANDSHAKE_FAILED = (zmq.EVENT_HANDSHAKE_FAILED_NO_DETAIL | zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL
                     | zmq.EVENT_HANDSHAKE_FAILED_AUTH)
_EVENTS = (zmq.EVENT_CONNECTED | zmq.EVENT_DISCONNECTED | zmq.EVENT_CONNECT_RETRIED
           | _HANDSHAKE_FAILED)
_KEY_AT = 3  # the head is magic (2 bytes), kind (1), key (16), ...

_links: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, dict[str, Link]] = (
    weakref.WeakKeyDictionary())


def _name(address: str, server_key: bytes) -> str:
    """A link's key among its loop's links: a source restarted with a new key is new."""
    return f"{address}/{server_key.hex()}"


@functools.cache
def _client_keys() -> tuple[bytes, bytes]:
    """This process's CURVE key pair as a receiver (public, secret; Z85)."""
    return zmq.curve_keypair()


class Link:
    """One connection to the source at ``address`` (``host:port``); CURVE when
    ``server_key`` (the source's public key, 32 bytes) is given."""

    def __init__(self, address: str, server_key: bytes = b"") -> None:
        self.address = address
        self.name = _name(address, server_key)
        self.queues: dict[bytes, asyncio.Queue] = {}
        self.failed: str | None = None
        self._sock = zmq.asyncio.Context.instance().socket(zmq.DEALER)
        self._sock.linger = 1000  # credits and cancels still leave when the link closes
        self._sock.rcvhwm = self._sock.sndhwm = 0  # the source's credit window bounds both
        if server_key:
            self._sock.curve_serverkey = z85.encode(server_key)
            self._sock.curve_publickey, self._sock.curve_secretkey = _client_keys()
        self._mon = self._sock.get_monitor_socket(_EVENTS)
        self._sock.connect(f"tcp://{address}")
        self._idle: asyncio.TimerHandle | None = None
        self._task = asyncio.get_running_loop().create_task(self._run())

    def open(self, key: bytes) -> asyncio.Queue:
        """The queue that receives the messages of the pull of ``key`` (then a reason
        string if the link fails)."""
        if self.failed is not None:
            raise TransferError(self.failed, 0, f"the link to {self.address} failed")
        if key in self.queues:
            raise TransferError("refused", 0, "this offer is already being pulled")
        if self._idle is not None:
            self._idle.cancel()
            self._idle = None
        q: asyncio.Queue = asyncio.Queue()
        self.queues[key] = q
        return q

    def release(self, key: bytes) -> None:
        self.queues.pop(key, None)
        if not self.queues and self.failed is None and self._idle is None:
            self._idle = asyncio.get_running_loop().call_later(IDLE_S, self._fail, "idle")

    def send(self, parts: list[bytes]) -> None:
        if self.failed is None:
            self._sock.send_multipart(parts)

    async def _run(self) -> None:
        recv, event = self._sock.recv_multipart(copy=False), self._mon.recv_multipart()
        connected = False
        try:
            while True:
                done, _ = await asyncio.wait((recv, event), return_when=asyncio.FIRST_COMPLETED)
                if recv in done:
                    self._route(recv.result())
                    if self.failed is not None:
                        return
                    recv = self._sock.recv_multipart(copy=False)
                    continue
                kind = parse_monitor_message(event.result())["event"]
                if kind == zmq.EVENT_CONNECTED:
                    connected = True
                elif kind == zmq.EVENT_CONNECT_RETRIED and not connected:
                    self._fail("unreachable")
                    return
                elif kind & _HANDSHAKE_FAILED:
                    self._fail("refused")  # not the source the endpoint names
                    return
                elif kind == zmq.EVENT_DISCONNECTED:
                    while True:  # what arrived before the connection ended still lands
                        got, _ = await asyncio.wait((recv,), timeout=GRACE_S)
                        if not got:
                            break
                        self._route(recv.result())
                        if self.failed is not None:
                            return
                        recv = self._sock.recv_multipart(copy=False)
                    self._fail("closed")
                    return
                event = self._mon.recv_multipart()
        finally:
            recv.cancel()
            event.cancel()
            self._fail("closed")
            self._sock.disable_monitor()
            self._mon.close(linger=0)
            self._sock.close()

    def _route(self, parts: list) -> None:
        head = parts[0].buffer
        if len(head) < HEAD.size or head[:2] != MAGIC:
            self._fail("malformed")  # a source that speaks nonsense: nothing it says counts
            return
        q = self.queues.get(bytes(head[_KEY_AT:_KEY_AT + KEY_BYTES]))
        if q is not None:  # else a pull that gave up: its late frames are dropped
            q.put_nowait(parts)

    def _fail(self, reason: str) -> None:
        if self.failed is not None:
            return
        self.failed = reason
        links = _links.get(asyncio.get_running_loop(), {})
        if links.get(self.name) is self:
            del links[self.name]
        for q in self.queues.values():
            q.put_nowait(reason)
        if self._idle is not None:
            self._idle.cancel()
        if asyncio.current_task() is not self._task:
            self._task.cancel()


def link(address: str, server_key: bytes = b"") -> Link:
    """The live link to ``address`` (CURVE to ``server_key`` if given) on this event loop,
    connecting one if there is none."""
    links = _links.setdefault(asyncio.get_running_loop(), {})
    name = _name(address, server_key)
    found = links.get(name)
    if found is None or found.failed is not None:
        found = links[name] = Link(address, server_key)
    return found


async def close_all() -> None:
    """Close this loop's links (tests; a worker's links close when idle)."""
    for lk in list(_links.get(asyncio.get_running_loop(), {}).values()):
        lk._fail("idle")
        with contextlib.suppress(asyncio.CancelledError):
            await lk._task
