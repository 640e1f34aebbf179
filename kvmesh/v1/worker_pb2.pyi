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
    __slots__ = ("request_id", "token_ids", "sampling", "salt", "lora", "mm", "index_matched_tokens", "index_matched_tokens_by_tier", "fetch", "tenant")
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
    FETCH_FIELD_NUMBER: _ClassVar[int]
    TENANT_FIELD_NUMBER: _ClassVar[int]
    request_id: str
    token_ids: _containers.RepeatedScalarFieldContainer[int]
    sampling: SamplingParams
    salt: str
    lora: _index_pb2.Lora
    mm: _containers.RepeatedCompositeFieldContainer[_index_pb2.MultimodalItem]
    index_matched_tokens: int
    index_matched_tokens_by_tier: _containers.ScalarMap[str, int]
    fetch: _index_pb2.FetchPlan
    tenant: str
    def __init__(self, request_id: _Optional[str] = ..., token_ids: _Optional[_Iterable[int]] = ..., sampling: _Optional[_Union[SamplingParams, _Mapping]] = ..., salt: _Optional[str] = ..., lora: _Optional[_Union[_index_pb2.Lora, _Mapping]] = ..., mm: _Optional[_Iterable[_Union[_index_pb2.MultimodalItem, _Mapping]]] = ..., index_matched_tokens: _Optional[int] = ..., index_matched_tokens_by_tier: _Optional[_Mapping[str, int]] = ..., fetch: _Optional[_Union[_index_pb2.FetchPlan, _Mapping]] = ..., tenant: _Optional[str] = ...) -> None: ...

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
    __slots__ = ("worker_id", "model", "load", "cache", "requests_done", "index_promised_tokens", "index_served_tokens", "tiers", "pinned_blocks", "mean_matched_tokens", "peer", "tenants")
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
    PEER_FIELD_NUMBER: _ClassVar[int]
    TENANTS_FIELD_NUMBER: _ClassVar[int]
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
    peer: PeerStats
    tenants: _containers.RepeatedCompositeFieldContainer[TenantStats]
    def __init__(self, worker_id: _Optional[str] = ..., model: _Optional[str] = ..., load: _Optional[_Union[_index_pb2.WorkerLoad, _Mapping]] = ..., cache: _Optional[_Union[CacheStats, _Mapping]] = ..., requests_done: _Optional[int] = ..., index_promised_tokens: _Optional[int] = ..., index_served_tokens: _Optional[int] = ..., tiers: _Optional[_Iterable[_Union[TierStats, _Mapping]]] = ..., pinned_blocks: _Optional[int] = ..., mean_matched_tokens: _Optional[float] = ..., peer: _Optional[_Union[PeerStats, _Mapping]] = ..., tenants: _Optional[_Iterable[_Union[TenantStats, _Mapping]]] = ...) -> None: ...

class TenantStats(_message.Message):
    __slots__ = ("tenant", "requests", "prompt_tokens", "cached_tokens", "tiers")
    TENANT_FIELD_NUMBER: _ClassVar[int]
    REQUESTS_FIELD_NUMBER: _ClassVar[int]
    PROMPT_TOKENS_FIELD_NUMBER: _ClassVar[int]
    CACHED_TOKENS_FIELD_NUMBER: _ClassVar[int]
    TIERS_FIELD_NUMBER: _ClassVar[int]
    tenant: str
    requests: int
    prompt_tokens: int
    cached_tokens: int
    tiers: _containers.RepeatedCompositeFieldContainer[TenantTier]
    def __init__(self, tenant: _Optional[str] = ..., requests: _Optional[int] = ..., prompt_tokens: _Optional[int] = ..., cached_tokens: _Optional[int] = ..., tiers: _Optional[_Iterable[_Union[TenantTier, _Mapping]]] = ...) -> None: ...

class TenantTier(_message.Message):
    __slots__ = ("tier", "blocks", "quota_blocks", "hit_blocks", "evicted_blocks")
    TIER_FIELD_NUMBER: _ClassVar[int]
    BLOCKS_FIELD_NUMBER: _ClassVar[int]
    QUOTA_BLOCKS_FIELD_NUMBER: _ClassVar[int]
    HIT_BLOCKS_FIELD_NUMBER: _ClassVar[int]
    EVICTED_BLOCKS_FIELD_NUMBER: _ClassVar[int]
    tier: str
    blocks: int
    quota_blocks: int
    hit_blocks: int
    evicted_blocks: int
    def __init__(self, tier: _Optional[str] = ..., blocks: _Optional[int] = ..., quota_blocks: _Optional[int] = ..., hit_blocks: _Optional[int] = ..., evicted_blocks: _Optional[int] = ...) -> None: ...

class PeerStats(_message.Message):
    __slots__ = ("fetches", "fetched_blocks", "fetched_bytes", "fallbacks", "served", "served_blocks", "served_bytes", "refused", "peer_hit_tokens", "fallbacks_by_reason")
    class FallbacksByReasonEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: int
        def __init__(self, key: _Optional[str] = ..., value: _Optional[int] = ...) -> None: ...
    FETCHES_FIELD_NUMBER: _ClassVar[int]
    FETCHED_BLOCKS_FIELD_NUMBER: _ClassVar[int]
    FETCHED_BYTES_FIELD_NUMBER: _ClassVar[int]
    FALLBACKS_FIELD_NUMBER: _ClassVar[int]
    SERVED_FIELD_NUMBER: _ClassVar[int]
    SERVED_BLOCKS_FIELD_NUMBER: _ClassVar[int]
    SERVED_BYTES_FIELD_NUMBER: _ClassVar[int]
    REFUSED_FIELD_NUMBER: _ClassVar[int]
    PEER_HIT_TOKENS_FIELD_NUMBER: _ClassVar[int]
    FALLBACKS_BY_REASON_FIELD_NUMBER: _ClassVar[int]
    fetches: int
    fetched_blocks: int
    fetched_bytes: int
    fallbacks: int
    served: int
    served_blocks: int
    served_bytes: int
    refused: int
    peer_hit_tokens: int
    fallbacks_by_reason: _containers.ScalarMap[str, int]
    def __init__(self, fetches: _Optional[int] = ..., fetched_blocks: _Optional[int] = ..., fetched_bytes: _Optional[int] = ..., fallbacks: _Optional[int] = ..., served: _Optional[int] = ..., served_blocks: _Optional[int] = ..., served_bytes: _Optional[int] = ..., refused: _Optional[int] = ..., peer_hit_tokens: _Optional[int] = ..., fallbacks_by_reason: _Optional[_Mapping[str, int]] = ...) -> None: ...

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
    __slots__ = ("requester_id", "block_hashes", "ticket", "proof", "transport")
    REQUESTER_ID_FIELD_NUMBER: _ClassVar[int]
    BLOCK_HASHES_FIELD_NUMBER: _ClassVar[int]
    TICKET_FIELD_NUMBER: _ClassVar[int]
    PROOF_FIELD_NUMBER: _ClassVar[int]
    TRANSPORT_FIELD_NUMBER: _ClassVar[int]
    requester_id: str
    block_hashes: _containers.RepeatedScalarFieldContainer[bytes]
    ticket: bytes
    proof: bytes
    transport: str
    def __init__(self, requester_id: _Optional[str] = ..., block_hashes: _Optional[_Iterable[bytes]] = ..., ticket: _Optional[bytes] = ..., proof: _Optional[bytes] = ..., transport: _Optional[str] = ...) -> None: ...

class FetchBlocksResponse(_message.Message):
    __slots__ = ("fingerprint", "blocks", "block_bytes", "token_ids", "endpoint", "data", "dtype", "block_shape")
    FINGERPRINT_FIELD_NUMBER: _ClassVar[int]
    BLOCKS_FIELD_NUMBER: _ClassVar[int]
    BLOCK_BYTES_FIELD_NUMBER: _ClassVar[int]
    TOKEN_IDS_FIELD_NUMBER: _ClassVar[int]
    ENDPOINT_FIELD_NUMBER: _ClassVar[int]
    DATA_FIELD_NUMBER: _ClassVar[int]
    DTYPE_FIELD_NUMBER: _ClassVar[int]
    BLOCK_SHAPE_FIELD_NUMBER: _ClassVar[int]
    fingerprint: bytes
    blocks: int
    block_bytes: int
    token_ids: _containers.RepeatedScalarFieldContainer[int]
    endpoint: str
    data: bytes
    dtype: str
    block_shape: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, fingerprint: _Optional[bytes] = ..., blocks: _Optional[int] = ..., block_bytes: _Optional[int] = ..., token_ids: _Optional[_Iterable[int]] = ..., endpoint: _Optional[str] = ..., data: _Optional[bytes] = ..., dtype: _Optional[str] = ..., block_shape: _Optional[_Iterable[int]] = ...) -> None: ...
