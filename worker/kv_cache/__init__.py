"""The worker's KV block manager: vLLM v1 automatic prefix caching over a paged block pool.

:class:`KVCacheManager` is what the engine uses; :class:`BlockPool`, :class:`FreeBlockQueue`
(or :class:`LayeredFreeQueue`) and :class:`PinTable` are its parts; the pool's events
(``kvmesh.events.pool``) tell the metadata service what is cached. Optional lower tiers
(:class:`LowerTier`: host memory, disk) keep what the pool evicts; the manager records the
copies between tiers as :mod:`.transfers` orders for the data plane.
"""
from .block import BlockContent, FreeBlockQueue, KVCacheBlock, LayeredFreeQueue
from .block_pool import BlockPool
from .lower_tier import LowerTier, TierEntry
from .manager import TIER_NAMES, KVCacheManager
from .pins import Pinned, PinTable
from .request import KVRequest
from .stats import CacheStats, TierCounters
from .transfers import Drop, Lost, Offload, Onboard, Spill, Transfer

__all__ = [
    "TIER_NAMES",
    "BlockContent",
    "BlockPool",
    "CacheStats",
    "Drop",
    "FreeBlockQueue",
    "KVCacheBlock",
    "KVCacheManager",
    "KVRequest",
    "LayeredFreeQueue",
    "Lost",
    "LowerTier",
    "Offload",
    "Onboard",
    "PinTable",
    "Pinned",
    "Spill",
    "TierCounters",
    "TierEntry",
    "Transfer",
]
