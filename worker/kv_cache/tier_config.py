"""``TierConfig``: a worker's KV-tier settings, written once for every CLI and launcher.

A worker's device pool may spill to host memory (``cpu_blocks``) and from there to disk
files (``disk_blocks`` under ``disk_dir``); ``eviction`` orders the device pool's free
blocks (``kvmesh.contract.EVICTIONS``) and ``auto_pin`` pins hot prefixes. The defaults here
are THE defaults (one device pool, LRU, no pins): the worker and ``kvmesh up`` flags, the
engine, ``deploy.local`` and the Ray launcher all read them from this class.

Contract: ``check()`` raises ``ValueError`` (naming the flag) for settings no engine
accepts; ``argv()`` is the ``kvmesh worker`` flags that rebuild an equal ``TierConfig``
(defaults left out). Torch-free: launchers import it.
"""
from __future__ import annotations

import os
from dataclasses import dataclass, fields, replace

from kvmesh.contract import EVICTIONS


@dataclass(frozen=True)
class TierConfig:
    """A worker's KV tiers; field ``name`` is flag ``--name`` (underscores as dashes)."""

    cpu_blocks: int = 0          # host-memory tier (0: off)
    disk_blocks: int = 0         # disk tier (0: off; needs cpu_blocks and disk_dir)
    disk_dir: str | os.PathLike[str] | None = None  # its files (kept across restarts)
    eviction: str = "lru"        # device-pool eviction order
    auto_pin: bool = False       # pin hot prefixes in the device pool automatically

    @property
    def lower(self) -> bool:
        """True when blocks leave the device pool for a lower tier."""
        return bool(self.cpu_blocks or self.disk_blocks)

    def check(self) -> None:
        """Raise ``ValueError`` for settings no engine accepts, before anything loads: a
        ``disk_dir`` another user owns or others may write included."""
        from kvmesh.ops.file_perms import check_private_dir

        if self.cpu_blocks < 0 or self.disk_blocks < 0:
            raise ValueError("--cpu-blocks and --disk-blocks must be >= 0")
        if self.disk_blocks and not self.disk_dir:
            raise ValueError("--disk-blocks needs --disk-dir")
        if self.disk_blocks and not self.cpu_blocks:
            raise ValueError("--disk-blocks needs --cpu-blocks (blocks reach disk through the "
                             "host tier)")
        if self.eviction not in EVICTIONS:
            raise ValueError(f"--eviction {self.eviction!r}: choose one of "
                             f"{', '.join(EVICTIONS)}")
        if self.disk_blocks:  # a directory others control is refused now, not after loading
            check_private_dir(self.disk_dir, "--disk-dir")

    def argv(self) -> list[str]:
        """The ``kvmesh worker`` flags of the settings that differ from the defaults."""
        out: list[str] = []
        for f in fields(self):
            value = getattr(self, f.name)
            if value == f.default:
                continue
            flag = "--" + f.name.replace("_", "-")
            if isinstance(value, bool):
                out.append(flag if value else f"--no-{flag[2:]}")
            else:
                out += [flag, str(value)]
        return out

    def of_worker(self, worker_id: str, *, absolute: bool = False) -> TierConfig:
        """The settings of worker ``worker_id`` of a fleet sharing these: its disk files in
        ``<disk_dir>/<worker_id>`` (``absolute``: resolved here, for a child process that
        runs from another directory)."""
        if not self.disk_dir:
            return self
        base = os.path.abspath(self.disk_dir) if absolute else self.disk_dir
        return replace(self, disk_dir=os.path.join(base, worker_id))

    def manager_kwargs(self) -> dict:
        """``KVCacheManager``'s tier arguments: only those off the defaults, so a pool
        without tiers is built exactly as one that never heard of them."""
        out: dict = {}
        if self.lower:
            out.update(cpu_blocks=self.cpu_blocks, disk_blocks=self.disk_blocks)
        if self.eviction != TierConfig.eviction:
            out["eviction"] = self.eviction
        if self.auto_pin:
            out["auto_pin"] = True
        return out
