"""The worker's KV block manager: vLLM v1 automatic prefix caching over a paged block pool.

:class:`KVCacheManager` is what the engine uses; :class:`BlockPool`, :class:`FreeBlockQueue`
(or :class:`LayeredFreeQueue`) and :class:`PinTable` are its parts; the events tell the
metadata service what is cached.
"""
from .block import BlockContent, FreeBlockQueue, KVCacheBlock, LayeredFreeQueue
from .block_pool import BlockPool
from .events import AllBlocksCleared, BlockRemoved, BlockStored, CacheSnapshot, KVEvent
from .manager import CacheStats, KVCacheManager
from .pins import PinTable
from .request import KVRequest

__all__ = [
    "AllBlocksCleared",
    "BlockContent",
    "BlockPool",
    "BlockRemoved",
    "BlockStored",
    "CacheSnapshot",
    "CacheStats",
    "FreeBlockQueue",
    "KVCacheBlock",
    "KVCacheManager",
    "KVEvent",
    "KVRequest",
    "LayeredFreeQueue",
    "PinTable",
]
