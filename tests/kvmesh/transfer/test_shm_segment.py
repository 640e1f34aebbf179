"""shm segments: private to their user (0600) whatever the umask, gone after every pull, and
the receiver opens nothing but a private kvmesh segment."""
from __future__ import annotations

import asyncio
import os
import stat
import time

import pytest

from kvmesh.transfer import shm_segment
from kvmesh.transfer.frames import TransferError
from kvmesh.transfer.transports import DataServer, pull


def _ours() -> list[str]:
    mine = f"{shm_segment.PREFIX}{os.getpid()}-"
    return [n for n in os.listdir(shm_segment.SHM_DIR) if n.startswith(mine)]


def test_a_segment_is_owner_only_even_under_an_open_umask() -> None:
    old = os.umask(0)
    try:
        path, fd = shm_segment.create(4096)
    finally:
        os.umask(old)
    try:
        st = os.fstat(fd)
        assert stat.S_IMODE(st.st_mode) == 0o600 and st.st_uid == os.getuid()
        assert os.path.dirname(path) == "/dev/shm"
    finally:
        os.close(fd)
        shm_segment.unlink(path)
    assert _ours() == []


def test_the_receiver_maps_and_unlinks_what_it_opens() -> None:
    path, fd = shm_segment.create(16)
    shm_segment.write(fd, [memoryview(b"a" * 8), memoryview(b"b" * 8)], 0)
    os.close(fd)
    seg = shm_segment.open_for_read(path, 16)
    try:
        assert not os.path.exists(path)
        assert bytes(seg) == b"a" * 8 + b"b" * 8
    finally:
        seg.close()


def test_a_segment_shorter_than_the_pull_is_truncated() -> None:
    path, fd = shm_segment.create(16)
    os.close(fd)
    try:
        with pytest.raises(TransferError) as e:
            shm_segment.open_for_read(path, 17, landed=3)
        assert (e.value.reason, e.value.landed) == ("truncated", 3)
    finally:
        shm_segment.unlink(path)


def test_a_segment_others_may_read_is_refused() -> None:
    path, fd = shm_segment.create(16)
    os.fchmod(fd, 0o644)
    os.close(fd)
    try:
        with pytest.raises(TransferError) as e:
            shm_segment.open_for_read(path, 16)
        assert e.value.reason == "refused"
    finally:
        shm_segment.unlink(path)


@pytest.mark.parametrize("path", ["/etc/passwd", "/dev/shm/../etc/passwd",
                                  "/dev/shm/kvmesh-kv-1-zz", "/tmp/kvmesh-kv-1-" + "0" * 32])
def test_the_receiver_opens_only_kvmesh_segment_names(path: str) -> None:
    with pytest.raises(TransferError) as e:
        shm_segment.open_for_read(path, 16)
    assert e.value.reason == "malformed"


def test_no_segment_outlives_a_pull_an_expiry_or_a_close() -> None:
    async def main() -> None:
        server = DataServer(frame_bytes=4096)
        await server.start()
        try:
            blocks = [os.urandom(4096) for _ in range(40)]
            seen_during: list[list[str]] = []
            await pull(server.offer("shm", blocks), 4096, 40,
                       lambda i, b: seen_during.append(_ours()), timeout_s=5)
            assert seen_during and all(s == [] for s in seen_during)  # unlinked on open
            lapsed = server.offer("shm", blocks, ttl_s=0.01)
            await asyncio.sleep(0.05)
            with pytest.raises(TransferError):
                await pull(lapsed, 4096, 40, lambda i, b: None, timeout_s=5)
            big = os.urandom(64 << 10)  # 512 frames, 64 in flight at most: the close lands mid-way
            ep = server.offer("shm", [big] * 512)
            closing: list[asyncio.Task] = []

            def sink(i: int, b: memoryview) -> None:
                if i == 0:
                    closing.append(asyncio.get_running_loop().create_task(server.close()))

            with pytest.raises(TransferError) as e:
                await pull(ep, 64 << 10, 512, sink, timeout_s=5)
            assert e.value.reason == "closed" and 1 <= e.value.landed < 512
            await asyncio.gather(*closing)
        finally:
            await server.close()
        assert _ours() == []

    asyncio.run(main())


def test_a_pull_longer_than_the_ring_reuses_its_slots_in_order() -> None:
    async def main() -> None:
        server = DataServer(frame_bytes=4096)  # one block a frame, a ring of 64 slots
        await server.start()
        try:
            blocks = [os.urandom(4096) for _ in range(300)]
            got: list[bytes] = []

            def sink(i: int, b: memoryview) -> None:
                if i % 50 == 0:
                    time.sleep(0.01)  # the source must wait for credit, not overwrite
                got.append(bytes(b))

            assert await pull(server.offer("shm", blocks), 4096, 300, sink, 10) == 300
            assert got == blocks
        finally:
            await server.close()

    asyncio.run(main())
