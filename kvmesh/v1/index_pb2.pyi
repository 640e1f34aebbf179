from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class Tier(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    TIER_UNSPECIFIED: _ClassVar[Tier]
    TIER_GPU: _ClassVar[Tier]
    TIER_CPU: _ClassVar[Tier]
    TIER_DISK: _ClassVar[Tier]
TIER_UNSPECIFIED: Tier
TIER_GPU: Tier
TIER_CPU: Tier
TIER_DISK: Tier

class Lora(_message.Message):
    __slots__ = ("name", "path")
    NAME_FIELD_NUMBER: _ClassVar[int]
    PATH_FIELD_NUMBER: _ClassVar[int]
    name: str
    path: str
    def __init__(self, name: _Optional[str] = ..., path: _Optional[str] = ...) -> None: ...

class MultimodalItem(_message.Message):
    __slots__ = ("identifier", "offset", "length")
    IDENTIFIER_FIELD_NUMBER: _ClassVar[int]
    OFFSET_FIELD_NUMBER: _ClassVar[int]
    LENGTH_FIELD_NUMBER: _ClassVar[int]
    identifier: str
    offset: int
    length: int
    def __init__(self, identifier: _Optional[str] = ..., offset: _Optional[int] = ..., length: _Optional[int] = ...) -> None: ...

class WorkerLoad(_message.Message):
    __slots__ = ("running", "waiting", "queued_prefill_tokens", "free_blocks", "total_blocks", "decode_tokens", "prefill_us_per_token", "onboard_us_per_block_cpu", "onboard_us_per_block_disk", "tier_blocks", "free_empty_blocks", "fetch_us_per_block", "fetch_us_per_call", "peer_fetch")
    RUNNING_FIELD_NUMBER: _ClassVar[int]
    WAITING_FIELD_NUMBER: _ClassVar[int]
    QUEUED_PREFILL_TOKENS_FIELD_NUMBER: _ClassVar[int]
    FREE_BLOCKS_FIELD_NUMBER: _ClassVar[int]
    TOTAL_BLOCKS_FIELD_NUMBER: _ClassVar[int]
    DECODE_TOKENS_FIELD_NUMBER: _ClassVar[int]
    PREFILL_US_PER_TOKEN_FIELD_NUMBER: _ClassVar[int]
    ONBOARD_US_PER_BLOCK_CPU_FIELD_NUMBER: _ClassVar[int]
    ONBOARD_US_PER_BLOCK_DISK_FIELD_NUMBER: _ClassVar[int]
    TIER_BLOCKS_FIELD_NUMBER: _ClassVar[int]
    FREE_EMPTY_BLOCKS_FIELD_NUMBER: _ClassVar[int]
    FETCH_US_PER_BLOCK_FIELD_NUMBER: _ClassVar[int]
    FETCH_US_PER_CALL_FIELD_NUMBER: _ClassVar[int]
    PEER_FETCH_FIELD_NUMBER: _ClassVar[int]
    running: int
    waiting: int
    queued_prefill_tokens: int
    free_blocks: int
    total_blocks: int
    decode_tokens: int
    prefill_us_per_token: float
    onboard_us_per_block_cpu: float
    onboard_us_per_block_disk: float
    tier_blocks: int
    free_empty_blocks: int
    fetch_us_per_block: float
    fetch_us_per_call: float
    peer_fetch: bool
    def __init__(self, running: _Optional[int] = ..., waiting: _Optional[int] = ..., queued_prefill_tokens: _Optional[int] = ..., free_blocks: _Optional[int] = ..., total_blocks: _Optional[int] = ..., decode_tokens: _Optional[int] = ..., prefill_us_per_token: _Optional[float] = ..., onboard_us_per_block_cpu: _Optional[float] = ..., onboard_us_per_block_disk: _Optional[float] = ..., tier_blocks: _Optional[int] = ..., free_empty_blocks: _Optional[int] = ..., fetch_us_per_block: _Optional[float] = ..., fetch_us_per_call: _Optional[float] = ..., peer_fetch: _Optional[bool] = ...) -> None: ...

class RegisterWorkerRequest(_message.Message):
    __slots__ = ("worker_id", "address", "model", "block_size", "hash_algo", "root_hash", "load", "incarnation")
    WORKER_ID_FIELD_NUMBER: _ClassVar[int]
    ADDRESS_FIELD_NUMBER: _ClassVar[int]
    MODEL_FIELD_NUMBER: _ClassVar[int]
    BLOCK_SIZE_FIELD_NUMBER: _ClassVar[int]
    HASH_ALGO_FIELD_NUMBER: _ClassVar[int]
    ROOT_HASH_FIELD_NUMBER: _ClassVar[int]
    LOAD_FIELD_NUMBER: _ClassVar[int]
    INCARNATION_FIELD_NUMBER: _ClassVar[int]
    worker_id: str
    address: str
    model: str
    block_size: int
    hash_algo: str
    root_hash: bytes
    load: WorkerLoad
    incarnation: int
    def __init__(self, worker_id: _Optional[str] = ..., address: _Optional[str] = ..., model: _Optional[str] = ..., block_size: _Optional[int] = ..., hash_algo: _Optional[str] = ..., root_hash: _Optional[bytes] = ..., load: _Optional[_Union[WorkerLoad, _Mapping]] = ..., incarnation: _Optional[int] = ...) -> None: ...

class RegisterWorkerResponse(_message.Message):
    __slots__ = ("namespace", "resync", "heartbeat_interval_ms", "liveness_timeout_ms")
    NAMESPACE_FIELD_NUMBER: _ClassVar[int]
    RESYNC_FIELD_NUMBER: _ClassVar[int]
    HEARTBEAT_INTERVAL_MS_FIELD_NUMBER: _ClassVar[int]
    LIVENESS_TIMEOUT_MS_FIELD_NUMBER: _ClassVar[int]
    namespace: str
    resync: bool
    heartbeat_interval_ms: int
    liveness_timeout_ms: int
    def __init__(self, namespace: _Optional[str] = ..., resync: _Optional[bool] = ..., heartbeat_interval_ms: _Optional[int] = ..., liveness_timeout_ms: _Optional[int] = ...) -> None: ...

class HeartbeatRequest(_message.Message):
    __slots__ = ("worker_id", "load", "last_seq", "incarnation", "quota_version")
    WORKER_ID_FIELD_NUMBER: _ClassVar[int]
    LOAD_FIELD_NUMBER: _ClassVar[int]
    LAST_SEQ_FIELD_NUMBER: _ClassVar[int]
    INCARNATION_FIELD_NUMBER: _ClassVar[int]
    QUOTA_VERSION_FIELD_NUMBER: _ClassVar[int]
    worker_id: str
    load: WorkerLoad
    last_seq: int
    incarnation: int
    quota_version: int
    def __init__(self, worker_id: _Optional[str] = ..., load: _Optional[_Union[WorkerLoad, _Mapping]] = ..., last_seq: _Optional[int] = ..., incarnation: _Optional[int] = ..., quota_version: _Optional[int] = ...) -> None: ...

class HeartbeatResponse(_message.Message):
    __slots__ = ("resync", "reregister", "quotas")
    RESYNC_FIELD_NUMBER: _ClassVar[int]
    REREGISTER_FIELD_NUMBER: _ClassVar[int]
    QUOTAS_FIELD_NUMBER: _ClassVar[int]
    resync: bool
    reregister: bool
    quotas: TenantQuotas
    def __init__(self, resync: _Optional[bool] = ..., reregister: _Optional[bool] = ..., quotas: _Optional[_Union[TenantQuotas, _Mapping]] = ...) -> None: ...

class BlockStored(_message.Message):
    __slots__ = ("block_hashes", "parent_hash", "tier")
    BLOCK_HASHES_FIELD_NUMBER: _ClassVar[int]
    PARENT_HASH_FIELD_NUMBER: _ClassVar[int]
    TIER_FIELD_NUMBER: _ClassVar[int]
    block_hashes: _containers.RepeatedScalarFieldContainer[bytes]
    parent_hash: bytes
    tier: Tier
    def __init__(self, block_hashes: _Optional[_Iterable[bytes]] = ..., parent_hash: _Optional[bytes] = ..., tier: _Optional[_Union[Tier, str]] = ...) -> None: ...

class BlockRemoved(_message.Message):
    __slots__ = ("block_hashes", "tier")
    BLOCK_HASHES_FIELD_NUMBER: _ClassVar[int]
    TIER_FIELD_NUMBER: _ClassVar[int]
    block_hashes: _containers.RepeatedScalarFieldContainer[bytes]
    tier: Tier
    def __init__(self, block_hashes: _Optional[_Iterable[bytes]] = ..., tier: _Optional[_Union[Tier, str]] = ...) -> None: ...

class AllBlocksCleared(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class KvEvent(_message.Message):
    __slots__ = ("seq", "stored", "removed", "cleared")
    SEQ_FIELD_NUMBER: _ClassVar[int]
    STORED_FIELD_NUMBER: _ClassVar[int]
    REMOVED_FIELD_NUMBER: _ClassVar[int]
    CLEARED_FIELD_NUMBER: _ClassVar[int]
    seq: int
    stored: BlockStored
    removed: BlockRemoved
    cleared: AllBlocksCleared
    def __init__(self, seq: _Optional[int] = ..., stored: _Optional[_Union[BlockStored, _Mapping]] = ..., removed: _Optional[_Union[BlockRemoved, _Mapping]] = ..., cleared: _Optional[_Union[AllBlocksCleared, _Mapping]] = ...) -> None: ...

class PublishEventsRequest(_message.Message):
    __slots__ = ("worker_id", "events", "incarnation")
    WORKER_ID_FIELD_NUMBER: _ClassVar[int]
    EVENTS_FIELD_NUMBER: _ClassVar[int]
    INCARNATION_FIELD_NUMBER: _ClassVar[int]
    worker_id: str
    events: _containers.RepeatedCompositeFieldContainer[KvEvent]
    incarnation: int
    def __init__(self, worker_id: _Optional[str] = ..., events: _Optional[_Iterable[_Union[KvEvent, _Mapping]]] = ..., incarnation: _Optional[int] = ...) -> None: ...

class PublishEventsResponse(_message.Message):
    __slots__ = ("applied", "resync", "last_seq")
    APPLIED_FIELD_NUMBER: _ClassVar[int]
    RESYNC_FIELD_NUMBER: _ClassVar[int]
    LAST_SEQ_FIELD_NUMBER: _ClassVar[int]
    applied: int
    resync: bool
    last_seq: int
    def __init__(self, applied: _Optional[int] = ..., resync: _Optional[bool] = ..., last_seq: _Optional[int] = ...) -> None: ...

class SyncWorkerRequest(_message.Message):
    __slots__ = ("worker_id", "seq", "blocks", "incarnation")
    WORKER_ID_FIELD_NUMBER: _ClassVar[int]
    SEQ_FIELD_NUMBER: _ClassVar[int]
    BLOCKS_FIELD_NUMBER: _ClassVar[int]
    INCARNATION_FIELD_NUMBER: _ClassVar[int]
    worker_id: str
    seq: int
    blocks: _containers.RepeatedCompositeFieldContainer[BlockStored]
    incarnation: int
    def __init__(self, worker_id: _Optional[str] = ..., seq: _Optional[int] = ..., blocks: _Optional[_Iterable[_Union[BlockStored, _Mapping]]] = ..., incarnation: _Optional[int] = ...) -> None: ...

class SyncWorkerResponse(_message.Message):
    __slots__ = ("indexed_blocks",)
    INDEXED_BLOCKS_FIELD_NUMBER: _ClassVar[int]
    indexed_blocks: int
    def __init__(self, indexed_blocks: _Optional[int] = ...) -> None: ...

class RouteRequest(_message.Message):
    __slots__ = ("token_ids", "salt", "lora", "mm", "model", "policy", "max_candidates", "dry_run", "token_ids_packed", "worker_id", "tenant")
    TOKEN_IDS_FIELD_NUMBER: _ClassVar[int]
    SALT_FIELD_NUMBER: _ClassVar[int]
    LORA_FIELD_NUMBER: _ClassVar[int]
    MM_FIELD_NUMBER: _ClassVar[int]
    MODEL_FIELD_NUMBER: _ClassVar[int]
    POLICY_FIELD_NUMBER: _ClassVar[int]
    MAX_CANDIDATES_FIELD_NUMBER: _ClassVar[int]
    DRY_RUN_FIELD_NUMBER: _ClassVar[int]
    TOKEN_IDS_PACKED_FIELD_NUMBER: _ClassVar[int]
    WORKER_ID_FIELD_NUMBER: _ClassVar[int]
    TENANT_FIELD_NUMBER: _ClassVar[int]
    token_ids: _containers.RepeatedScalarFieldContainer[int]
    salt: str
    lora: Lora
    mm: _containers.RepeatedCompositeFieldContainer[MultimodalItem]
    model: str
    policy: str
    max_candidates: int
    dry_run: bool
    token_ids_packed: bytes
    worker_id: str
    tenant: str
    def __init__(self, token_ids: _Optional[_Iterable[int]] = ..., salt: _Optional[str] = ..., lora: _Optional[_Union[Lora, _Mapping]] = ..., mm: _Optional[_Iterable[_Union[MultimodalItem, _Mapping]]] = ..., model: _Optional[str] = ..., policy: _Optional[str] = ..., max_candidates: _Optional[int] = ..., dry_run: _Optional[bool] = ..., token_ids_packed: _Optional[bytes] = ..., worker_id: _Optional[str] = ..., tenant: _Optional[str] = ...) -> None: ...

class FetchPlan(_message.Message):
    __slots__ = ("source_worker_id", "source_address", "start_block", "block_hashes", "tokens", "est_s", "ticket")
    SOURCE_WORKER_ID_FIELD_NUMBER: _ClassVar[int]
    SOURCE_ADDRESS_FIELD_NUMBER: _ClassVar[int]
    START_BLOCK_FIELD_NUMBER: _ClassVar[int]
    BLOCK_HASHES_FIELD_NUMBER: _ClassVar[int]
    TOKENS_FIELD_NUMBER: _ClassVar[int]
    EST_S_FIELD_NUMBER: _ClassVar[int]
    TICKET_FIELD_NUMBER: _ClassVar[int]
    source_worker_id: str
    source_address: str
    start_block: int
    block_hashes: _containers.RepeatedScalarFieldContainer[bytes]
    tokens: int
    est_s: float
    ticket: bytes
    def __init__(self, source_worker_id: _Optional[str] = ..., source_address: _Optional[str] = ..., start_block: _Optional[int] = ..., block_hashes: _Optional[_Iterable[bytes]] = ..., tokens: _Optional[int] = ..., est_s: _Optional[float] = ..., ticket: _Optional[bytes] = ...) -> None: ...

class Candidate(_message.Message):
    __slots__ = ("worker_id", "address", "matched_tokens", "tier", "cost", "load", "matched_tokens_by_tier", "fetch")
    class MatchedTokensByTierEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: int
        def __init__(self, key: _Optional[str] = ..., value: _Optional[int] = ...) -> None: ...
    WORKER_ID_FIELD_NUMBER: _ClassVar[int]
    ADDRESS_FIELD_NUMBER: _ClassVar[int]
    MATCHED_TOKENS_FIELD_NUMBER: _ClassVar[int]
    TIER_FIELD_NUMBER: _ClassVar[int]
    COST_FIELD_NUMBER: _ClassVar[int]
    LOAD_FIELD_NUMBER: _ClassVar[int]
    MATCHED_TOKENS_BY_TIER_FIELD_NUMBER: _ClassVar[int]
    FETCH_FIELD_NUMBER: _ClassVar[int]
    worker_id: str
    address: str
    matched_tokens: int
    tier: Tier
    cost: float
    load: WorkerLoad
    matched_tokens_by_tier: _containers.ScalarMap[str, int]
    fetch: FetchPlan
    def __init__(self, worker_id: _Optional[str] = ..., address: _Optional[str] = ..., matched_tokens: _Optional[int] = ..., tier: _Optional[_Union[Tier, str]] = ..., cost: _Optional[float] = ..., load: _Optional[_Union[WorkerLoad, _Mapping]] = ..., matched_tokens_by_tier: _Optional[_Mapping[str, int]] = ..., fetch: _Optional[_Union[FetchPlan, _Mapping]] = ...) -> None: ...

class RouteResponse(_message.Message):
    __slots__ = ("candidates", "degraded", "prompt_tokens", "policy")
    CANDIDATES_FIELD_NUMBER: _ClassVar[int]
    DEGRADED_FIELD_NUMBER: _ClassVar[int]
    PROMPT_TOKENS_FIELD_NUMBER: _ClassVar[int]
    POLICY_FIELD_NUMBER: _ClassVar[int]
    candidates: _containers.RepeatedCompositeFieldContainer[Candidate]
    degraded: bool
    prompt_tokens: int
    policy: str
    def __init__(self, candidates: _Optional[_Iterable[_Union[Candidate, _Mapping]]] = ..., degraded: _Optional[bool] = ..., prompt_tokens: _Optional[int] = ..., policy: _Optional[str] = ...) -> None: ...

class PrefixRef(_message.Message):
    __slots__ = ("token_ids", "salt", "lora", "mm", "model", "block_hashes")
    TOKEN_IDS_FIELD_NUMBER: _ClassVar[int]
    SALT_FIELD_NUMBER: _ClassVar[int]
    LORA_FIELD_NUMBER: _ClassVar[int]
    MM_FIELD_NUMBER: _ClassVar[int]
    MODEL_FIELD_NUMBER: _ClassVar[int]
    BLOCK_HASHES_FIELD_NUMBER: _ClassVar[int]
    token_ids: _containers.RepeatedScalarFieldContainer[int]
    salt: str
    lora: Lora
    mm: _containers.RepeatedCompositeFieldContainer[MultimodalItem]
    model: str
    block_hashes: _containers.RepeatedScalarFieldContainer[bytes]
    def __init__(self, token_ids: _Optional[_Iterable[int]] = ..., salt: _Optional[str] = ..., lora: _Optional[_Union[Lora, _Mapping]] = ..., mm: _Optional[_Iterable[_Union[MultimodalItem, _Mapping]]] = ..., model: _Optional[str] = ..., block_hashes: _Optional[_Iterable[bytes]] = ...) -> None: ...

class PinPrefixRequest(_message.Message):
    __slots__ = ("prefix", "ttl_s", "max_workers")
    PREFIX_FIELD_NUMBER: _ClassVar[int]
    TTL_S_FIELD_NUMBER: _ClassVar[int]
    MAX_WORKERS_FIELD_NUMBER: _ClassVar[int]
    prefix: PrefixRef
    ttl_s: float
    max_workers: int
    def __init__(self, prefix: _Optional[_Union[PrefixRef, _Mapping]] = ..., ttl_s: _Optional[float] = ..., max_workers: _Optional[int] = ...) -> None: ...

class PinnedWorker(_message.Message):
    __slots__ = ("worker_id", "pinned_blocks", "error", "chain_blocks", "cap_reached")
    WORKER_ID_FIELD_NUMBER: _ClassVar[int]
    PINNED_BLOCKS_FIELD_NUMBER: _ClassVar[int]
    ERROR_FIELD_NUMBER: _ClassVar[int]
    CHAIN_BLOCKS_FIELD_NUMBER: _ClassVar[int]
    CAP_REACHED_FIELD_NUMBER: _ClassVar[int]
    worker_id: str
    pinned_blocks: int
    error: str
    chain_blocks: int
    cap_reached: bool
    def __init__(self, worker_id: _Optional[str] = ..., pinned_blocks: _Optional[int] = ..., error: _Optional[str] = ..., chain_blocks: _Optional[int] = ..., cap_reached: _Optional[bool] = ...) -> None: ...

class PinPrefixResponse(_message.Message):
    __slots__ = ("chain_blocks", "workers")
    CHAIN_BLOCKS_FIELD_NUMBER: _ClassVar[int]
    WORKERS_FIELD_NUMBER: _ClassVar[int]
    chain_blocks: int
    workers: _containers.RepeatedCompositeFieldContainer[PinnedWorker]
    def __init__(self, chain_blocks: _Optional[int] = ..., workers: _Optional[_Iterable[_Union[PinnedWorker, _Mapping]]] = ...) -> None: ...

class UnpinPrefixRequest(_message.Message):
    __slots__ = ("prefix",)
    PREFIX_FIELD_NUMBER: _ClassVar[int]
    prefix: PrefixRef
    def __init__(self, prefix: _Optional[_Union[PrefixRef, _Mapping]] = ...) -> None: ...

class UnpinPrefixResponse(_message.Message):
    __slots__ = ("workers",)
    WORKERS_FIELD_NUMBER: _ClassVar[int]
    workers: _containers.RepeatedCompositeFieldContainer[PinnedWorker]
    def __init__(self, workers: _Optional[_Iterable[_Union[PinnedWorker, _Mapping]]] = ...) -> None: ...

class StatsRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class WorkerInfo(_message.Message):
    __slots__ = ("worker_id", "address", "model", "alive", "load", "indexed_blocks", "last_seq", "heartbeat_age_s")
    WORKER_ID_FIELD_NUMBER: _ClassVar[int]
    ADDRESS_FIELD_NUMBER: _ClassVar[int]
    MODEL_FIELD_NUMBER: _ClassVar[int]
    ALIVE_FIELD_NUMBER: _ClassVar[int]
    LOAD_FIELD_NUMBER: _ClassVar[int]
    INDEXED_BLOCKS_FIELD_NUMBER: _ClassVar[int]
    LAST_SEQ_FIELD_NUMBER: _ClassVar[int]
    HEARTBEAT_AGE_S_FIELD_NUMBER: _ClassVar[int]
    worker_id: str
    address: str
    model: str
    alive: bool
    load: WorkerLoad
    indexed_blocks: int
    last_seq: int
    heartbeat_age_s: float
    def __init__(self, worker_id: _Optional[str] = ..., address: _Optional[str] = ..., model: _Optional[str] = ..., alive: _Optional[bool] = ..., load: _Optional[_Union[WorkerLoad, _Mapping]] = ..., indexed_blocks: _Optional[int] = ..., last_seq: _Optional[int] = ..., heartbeat_age_s: _Optional[float] = ...) -> None: ...

class StatsResponse(_message.Message):
    __slots__ = ("workers", "counters", "degraded")
    class CountersEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: float
        def __init__(self, key: _Optional[str] = ..., value: _Optional[float] = ...) -> None: ...
    WORKERS_FIELD_NUMBER: _ClassVar[int]
    COUNTERS_FIELD_NUMBER: _ClassVar[int]
    DEGRADED_FIELD_NUMBER: _ClassVar[int]
    workers: _containers.RepeatedCompositeFieldContainer[WorkerInfo]
    counters: _containers.ScalarMap[str, float]
    degraded: bool
    def __init__(self, workers: _Optional[_Iterable[_Union[WorkerInfo, _Mapping]]] = ..., counters: _Optional[_Mapping[str, float]] = ..., degraded: _Optional[bool] = ...) -> None: ...

class TenantQuota(_message.Message):
    __slots__ = ("tenant", "gpu", "cpu", "disk")
    TENANT_FIELD_NUMBER: _ClassVar[int]
    GPU_FIELD_NUMBER: _ClassVar[int]
    CPU_FIELD_NUMBER: _ClassVar[int]
    DISK_FIELD_NUMBER: _ClassVar[int]
    tenant: str
    gpu: float
    cpu: float
    disk: float
    def __init__(self, tenant: _Optional[str] = ..., gpu: _Optional[float] = ..., cpu: _Optional[float] = ..., disk: _Optional[float] = ...) -> None: ...

class TenantQuotas(_message.Message):
    __slots__ = ("default_quota", "tenants", "version")
    DEFAULT_QUOTA_FIELD_NUMBER: _ClassVar[int]
    TENANTS_FIELD_NUMBER: _ClassVar[int]
    VERSION_FIELD_NUMBER: _ClassVar[int]
    default_quota: TenantQuota
    tenants: _containers.RepeatedCompositeFieldContainer[TenantQuota]
    version: int
    def __init__(self, default_quota: _Optional[_Union[TenantQuota, _Mapping]] = ..., tenants: _Optional[_Iterable[_Union[TenantQuota, _Mapping]]] = ..., version: _Optional[int] = ...) -> None: ...

class SetTenantQuotaRequest(_message.Message):
    __slots__ = ("quota", "clear")
    QUOTA_FIELD_NUMBER: _ClassVar[int]
    CLEAR_FIELD_NUMBER: _ClassVar[int]
    quota: TenantQuota
    clear: bool
    def __init__(self, quota: _Optional[_Union[TenantQuota, _Mapping]] = ..., clear: _Optional[bool] = ...) -> None: ...

class SetTenantQuotaResponse(_message.Message):
    __slots__ = ("quotas",)
    QUOTAS_FIELD_NUMBER: _ClassVar[int]
    quotas: TenantQuotas
    def __init__(self, quotas: _Optional[_Union[TenantQuotas, _Mapping]] = ...) -> None: ...

class GetTenantQuotasRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class GetTenantQuotasResponse(_message.Message):
    __slots__ = ("quotas",)
    QUOTAS_FIELD_NUMBER: _ClassVar[int]
    quotas: TenantQuotas
    def __init__(self, quotas: _Optional[_Union[TenantQuotas, _Mapping]] = ...) -> None: ...
