from kvmesh.v1 import index_pb2 as _index_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class SamplingParams(_message.Message):
    __slots__ = ("max_tokens", "temperature", "seed", "ignore_eos")
    MAX_TOKENS_FIELD_NUMBER: _ClassVar[int]
    TEMPERATURE_FIELD_NUMBER: _ClassVar[int]
    SEED_FIELD_NUMBER: _ClassVar[int]
    IGNORE_EOS_FIELD_NUMBER: _ClassVar[int]
    max_tokens: int
    temperature: float
    seed: int
    ignore_eos: bool
    def __init__(self, max_tokens: _Optional[int] = ..., temperature: _Optional[float] = ..., seed: _Optional[int] = ..., ignore_eos: _Optional[bool] = ...) -> None: ...

class GenerateRequest(_message.Message):
    __slots__ = ("request_id", "token_ids", "sampling", "salt", "lora", "mm", "index_matched_tokens", "index_matched_tokens_by_tier")
    class IndexMatchedTokensByTierEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: int
        def __init__(self, key: _Optional[str] = ..., value: _Optional[int] = ...) -> None: ...
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    TOKEN_IDS_FIELD_NUMBER: _ClassVar[int]
    SAMPLING_FIELD_NUMBER: _ClassVar[int]
    SALT_FIELD_NUMBER: _ClassVar[int]
    LORA_FIELD_NUMBER: _ClassVar[int]
    MM_FIELD_NUMBER: _ClassVar[int]
    INDEX_MATCHED_TOKENS_FIELD_NUMBER: _ClassVar[int]
    INDEX_MATCHED_TOKENS_BY_TIER_FIELD_NUMBER: _ClassVar[int]
    request_id: str
    token_ids: _containers.RepeatedScalarFieldContainer[int]
    sampling: SamplingParams
    salt: str
    lora: _index_pb2.Lora
    mm: _containers.RepeatedCompositeFieldContainer[_index_pb2.MultimodalItem]
    index_matched_tokens: int
    index_matched_tokens_by_tier: _containers.ScalarMap[str, int]
    def __init__(self, request_id: _Optional[str] = ..., token_ids: _Optional[_Iterable[int]] = ..., sampling: _Optional[_Union[SamplingParams, _Mapping]] = ..., salt: _Optional[str] = ..., lora: _Optional[_Union[_index_pb2.Lora, _Mapping]] = ..., mm: _Optional[_Iterable[_Union[_index_pb2.MultimodalItem, _Mapping]]] = ..., index_matched_tokens: _Optional[int] = ..., index_matched_tokens_by_tier: _Optional[_Mapping[str, int]] = ...) -> None: ...

class GenerateResponse(_message.Message):
    __slots__ = ("token_ids", "finished", "finish_reason", "num_cached_tokens", "prompt_tokens", "ttft_s", "e2e_s", "worker_id", "cached_tokens_by_tier")
    class CachedTokensByTierEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: int
        def __init__(self, key: _Optional[str] = ..., value: _Optional[int] = ...) -> None: ...
    TOKEN_IDS_FIELD_NUMBER: _ClassVar[int]
    FINISHED_FIELD_NUMBER: _ClassVar[int]
    FINISH_REASON_FIELD_NUMBER: _ClassVar[int]
    NUM_CACHED_TOKENS_FIELD_NUMBER: _ClassVar[int]
    PROMPT_TOKENS_FIELD_NUMBER: _ClassVar[int]
    TTFT_S_FIELD_NUMBER: _ClassVar[int]
    E2E_S_FIELD_NUMBER: _ClassVar[int]
    WORKER_ID_FIELD_NUMBER: _ClassVar[int]
    CACHED_TOKENS_BY_TIER_FIELD_NUMBER: _ClassVar[int]
    token_ids: _containers.RepeatedScalarFieldContainer[int]
    finished: bool
    finish_reason: str
    num_cached_tokens: int
    prompt_tokens: int
    ttft_s: float
    e2e_s: float
    worker_id: str
    cached_tokens_by_tier: _containers.ScalarMap[str, int]
    def __init__(self, token_ids: _Optional[_Iterable[int]] = ..., finished: _Optional[bool] = ..., finish_reason: _Optional[str] = ..., num_cached_tokens: _Optional[int] = ..., prompt_tokens: _Optional[int] = ..., ttft_s: _Optional[float] = ..., e2e_s: _Optional[float] = ..., worker_id: _Optional[str] = ..., cached_tokens_by_tier: _Optional[_Mapping[str, int]] = ...) -> None: ...

class WorkerStatsRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class CacheStats(_message.Message):
    __slots__ = ("queries", "hits", "hit_rate", "evictions", "used_blocks", "cached_blocks", "free_blocks", "total_blocks", "cached_hashes")
    QUERIES_FIELD_NUMBER: _ClassVar[int]
    HITS_FIELD_NUMBER: _ClassVar[int]
    HIT_RATE_FIELD_NUMBER: _ClassVar[int]
    EVICTIONS_FIELD_NUMBER: _ClassVar[int]
    USED_BLOCKS_FIELD_NUMBER: _ClassVar[int]
    CACHED_BLOCKS_FIELD_NUMBER: _ClassVar[int]
    FREE_BLOCKS_FIELD_NUMBER: _ClassVar[int]
    TOTAL_BLOCKS_FIELD_NUMBER: _ClassVar[int]
    CACHED_HASHES_FIELD_NUMBER: _ClassVar[int]
    queries: int
    hits: int
    hit_rate: float
    evictions: int
    used_blocks: int
    cached_blocks: int
    free_blocks: int
    total_blocks: int
    cached_hashes: int
    def __init__(self, queries: _Optional[int] = ..., hits: _Optional[int] = ..., hit_rate: _Optional[float] = ..., evictions: _Optional[int] = ..., used_blocks: _Optional[int] = ..., cached_blocks: _Optional[int] = ..., free_blocks: _Optional[int] = ..., total_blocks: _Optional[int] = ..., cached_hashes: _Optional[int] = ...) -> None: ...

class TierStats(_message.Message):
    __slots__ = ("tier", "capacity_blocks", "cached_blocks", "hit_tokens", "evictions", "offloads", "onboard_blocks", "onboard_bytes", "onboard_seconds", "index_promised_tokens", "index_missed_tokens")
    TIER_FIELD_NUMBER: _ClassVar[int]
    CAPACITY_BLOCKS_FIELD_NUMBER: _ClassVar[int]
    CACHED_BLOCKS_FIELD_NUMBER: _ClassVar[int]
    HIT_TOKENS_FIELD_NUMBER: _ClassVar[int]
    EVICTIONS_FIELD_NUMBER: _ClassVar[int]
    OFFLOADS_FIELD_NUMBER: _ClassVar[int]
    ONBOARD_BLOCKS_FIELD_NUMBER: _ClassVar[int]
    ONBOARD_BYTES_FIELD_NUMBER: _ClassVar[int]
    ONBOARD_SECONDS_FIELD_NUMBER: _ClassVar[int]
    INDEX_PROMISED_TOKENS_FIELD_NUMBER: _ClassVar[int]
    INDEX_MISSED_TOKENS_FIELD_NUMBER: _ClassVar[int]
    tier: str
    capacity_blocks: int
    cached_blocks: int
    hit_tokens: int
    evictions: int
    offloads: int
    onboard_blocks: int
    onboard_bytes: int
    onboard_seconds: float
    index_promised_tokens: int
    index_missed_tokens: int
    def __init__(self, tier: _Optional[str] = ..., capacity_blocks: _Optional[int] = ..., cached_blocks: _Optional[int] = ..., hit_tokens: _Optional[int] = ..., evictions: _Optional[int] = ..., offloads: _Optional[int] = ..., onboard_blocks: _Optional[int] = ..., onboard_bytes: _Optional[int] = ..., onboard_seconds: _Optional[float] = ..., index_promised_tokens: _Optional[int] = ..., index_missed_tokens: _Optional[int] = ...) -> None: ...

class WorkerStatsResponse(_message.Message):
    __slots__ = ("worker_id", "model", "load", "cache", "requests_done", "index_promised_tokens", "index_served_tokens", "tiers", "pinned_blocks", "mean_matched_tokens")
    WORKER_ID_FIELD_NUMBER: _ClassVar[int]
    MODEL_FIELD_NUMBER: _ClassVar[int]
    LOAD_FIELD_NUMBER: _ClassVar[int]
    CACHE_FIELD_NUMBER: _ClassVar[int]
    REQUESTS_DONE_FIELD_NUMBER: _ClassVar[int]
    INDEX_PROMISED_TOKENS_FIELD_NUMBER: _ClassVar[int]
    INDEX_SERVED_TOKENS_FIELD_NUMBER: _ClassVar[int]
    TIERS_FIELD_NUMBER: _ClassVar[int]
    PINNED_BLOCKS_FIELD_NUMBER: _ClassVar[int]
    MEAN_MATCHED_TOKENS_FIELD_NUMBER: _ClassVar[int]
    worker_id: str
    model: str
    load: _index_pb2.WorkerLoad
    cache: CacheStats
    requests_done: int
    index_promised_tokens: int
    index_served_tokens: int
    tiers: _containers.RepeatedCompositeFieldContainer[TierStats]
    pinned_blocks: int
    mean_matched_tokens: float
    def __init__(self, worker_id: _Optional[str] = ..., model: _Optional[str] = ..., load: _Optional[_Union[_index_pb2.WorkerLoad, _Mapping]] = ..., cache: _Optional[_Union[CacheStats, _Mapping]] = ..., requests_done: _Optional[int] = ..., index_promised_tokens: _Optional[int] = ..., index_served_tokens: _Optional[int] = ..., tiers: _Optional[_Iterable[_Union[TierStats, _Mapping]]] = ..., pinned_blocks: _Optional[int] = ..., mean_matched_tokens: _Optional[float] = ...) -> None: ...

class PinRequest(_message.Message):
    __slots__ = ("token_ids", "salt", "lora", "mm", "block_hashes", "ttl_s", "warm", "unpin")
    TOKEN_IDS_FIELD_NUMBER: _ClassVar[int]
    SALT_FIELD_NUMBER: _ClassVar[int]
    LORA_FIELD_NUMBER: _ClassVar[int]
    MM_FIELD_NUMBER: _ClassVar[int]
    BLOCK_HASHES_FIELD_NUMBER: _ClassVar[int]
    TTL_S_FIELD_NUMBER: _ClassVar[int]
    WARM_FIELD_NUMBER: _ClassVar[int]
    UNPIN_FIELD_NUMBER: _ClassVar[int]
    token_ids: _containers.RepeatedScalarFieldContainer[int]
    salt: str
    lora: _index_pb2.Lora
    mm: _containers.RepeatedCompositeFieldContainer[_index_pb2.MultimodalItem]
    block_hashes: _containers.RepeatedScalarFieldContainer[bytes]
    ttl_s: float
    warm: bool
    unpin: bool
    def __init__(self, token_ids: _Optional[_Iterable[int]] = ..., salt: _Optional[str] = ..., lora: _Optional[_Union[_index_pb2.Lora, _Mapping]] = ..., mm: _Optional[_Iterable[_Union[_index_pb2.MultimodalItem, _Mapping]]] = ..., block_hashes: _Optional[_Iterable[bytes]] = ..., ttl_s: _Optional[float] = ..., warm: _Optional[bool] = ..., unpin: _Optional[bool] = ...) -> None: ...

class PinResponse(_message.Message):
    __slots__ = ("pinned_blocks", "chain_blocks", "cap_reached")
    PINNED_BLOCKS_FIELD_NUMBER: _ClassVar[int]
    CHAIN_BLOCKS_FIELD_NUMBER: _ClassVar[int]
    CAP_REACHED_FIELD_NUMBER: _ClassVar[int]
    pinned_blocks: int
    chain_blocks: int
    cap_reached: bool
    def __init__(self, pinned_blocks: _Optional[int] = ..., chain_blocks: _Optional[int] = ..., cap_reached: _Optional[bool] = ...) -> None: ...

class FetchBlocksRequest(_message.Message):
    __slots__ = ("block_hashes", "tier")
    BLOCK_HASHES_FIELD_NUMBER: _ClassVar[int]
    TIER_FIELD_NUMBER: _ClassVar[int]
    block_hashes: _containers.RepeatedScalarFieldContainer[bytes]
    tier: _index_pb2.Tier
    def __init__(self, block_hashes: _Optional[_Iterable[bytes]] = ..., tier: _Optional[_Union[_index_pb2.Tier, str]] = ...) -> None: ...

class FetchBlocksResponse(_message.Message):
    __slots__ = ("block_hash", "kv", "shape", "dtype")
    BLOCK_HASH_FIELD_NUMBER: _ClassVar[int]
    KV_FIELD_NUMBER: _ClassVar[int]
    SHAPE_FIELD_NUMBER: _ClassVar[int]
    DTYPE_FIELD_NUMBER: _ClassVar[int]
    block_hash: bytes
    kv: bytes
    shape: _containers.RepeatedScalarFieldContainer[int]
    dtype: str
    def __init__(self, block_hash: _Optional[bytes] = ..., kv: _Optional[bytes] = ..., shape: _Optional[_Iterable[int]] = ..., dtype: _Optional[str] = ...) -> None: ...
