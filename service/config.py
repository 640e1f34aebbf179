"""Settings of the metadata service (one dataclass; the CLI maps its flags onto it).

Every replica of one cluster must run with the same ``hash_seed`` as the workers (the root
hash check at registration enforces it) and should share the liveness settings.
"""
from __future__ import annotations

import dataclasses
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from kvmesh.contract import POLICIES
from kvmesh.hashing import DEFAULT_SEED

if TYPE_CHECKING:  # grpc stays unimported until a server is built (`kvmesh --help` is fast)
    from kvmesh.rpc.tls import TlsFiles
    from service.policy.fetch import FetchCosts

BACKENDS = ("memory", "redis")


@dataclass(frozen=True)
class CostWeights:
    """Weights of the ``kvmesh`` cost model (units: prefill-token equivalents); the terms
    are documented in ``service.policy.cost``:

    cost = prefill_weight * (prompt - credited matched tokens)
         + saturation_weight * (share of the prompt recomputed) * least queued prefill
         + queue_weight * prefill tokens already queued on the worker
         + decode_weight * context tokens of its running sequences
         + running_weight * its running sequences
         + wait_weight * blocks it must free first * block_size (``service.policy.room``)
         + evict_weight * cached blocks it evicts * block_size (``service.policy.room``)

    A GPU-tier match is credited fully; a CPU- or disk-tier match a fraction of its tokens
    (loading them back is cheaper than recomputing, not free): what onboarding saves on that
    worker, from the costs it measures (``service.credits``). ``cpu_credit`` / ``disk_credit``,
    when set, override the measurement for every worker; ``*_credit_fallback`` is the credit
    of a worker that has not measured its costs (yet). ``saturation_weight`` 0 and
    ``wait_weight`` 0 turn those terms off.
    """

    # Recomputing a prefix costs the worker now AND evicts other sessions' blocks later, so
    # a token to prefill weighs twice a token already queued: measured on both Mooncake
    # traces (kvmesh bench replay), 2.0 beat 1.0, 1.5, 3 and 4 on hit rate and p90 TTFT.
    prefill_weight: float = 2.0
    # A queued token is mostly a cache hit's cheap suffix or a prefill the worker does
    # anyway, while a recompute elsewhere also evicts: 0.5 (leave a holder only for a queue
    # over 4x the recompute) raised the hit rate on all three replay traces (synthetic
    # 32.44 -> 33.40%, conversation 14.15 -> 14.49%, chat 53.91 -> 54.12%); the saturated
    # e2e runs do not tell 0.5 from 1.0 apart (docs/benchmarks.md, "The cost model's terms").
    queue_weight: float = 0.5
    decode_weight: float = 0.1
    running_weight: float = 16.0
    cpu_credit: float | None = None
    disk_credit: float | None = None
    cpu_credit_fallback: float = 0.5
    disk_credit_fallback: float = 0.25
    # At saturation a recompute costs capacity every queued request waits for; weighing
    # it by the fleet's backlog floor keeps prefixes on their holders (kvmesh bench e2e
    # --rate 40, docs/benchmarks.md).
    saturation_weight: float = 1.0
    wait_weight: float = 1.0
    # A full pool pays for new blocks with other prefixes' blocks: 1.0 raised the hit rate
    # at saturation (e2e 82% -> 90%), on the chat trace (+1.2 points) and the conversation
    # trace (+0.3), left the synthetic one within 0.2 points, and no TTFT got worse
    # (docs/benchmarks.md, "The cost model's terms").
    evict_weight: float = 1.0

    def __post_init__(self) -> None:
        for name in ("prefill_weight", "queue_weight", "decode_weight", "running_weight",
                     "saturation_weight", "wait_weight", "evict_weight"):
            if not getattr(self, name) >= 0.0:
                raise ValueError(f"{name} must be >= 0, got {getattr(self, name)}")
        for name in ("cpu_credit", "disk_credit", "cpu_credit_fallback",
                     "disk_credit_fallback"):
            value = getattr(self, name)
            if value is not None and not 0.0 <= value <= 1.0:
                raise ValueError(f"{name} must be in [0, 1], got {value}")


def cost_weight_names() -> tuple[str, ...]:
    """The fields of ``CostWeights``: what ``--cost-weight NAME=VALUE`` may set."""
    return tuple(f.name for f in dataclasses.fields(CostWeights))


def parse_cost_weights(items: Iterable[str]) -> dict[str, float]:
    """``["saturation_weight=0", "wait_weight=0.5"]`` -> ``{name: value}`` (a name given
    twice: the last wins). Raises ``ValueError`` naming the valid names for an item that is
    not ``NAME=VALUE`` with ``NAME`` a ``CostWeights`` field, and saying so for a value that
    is not a number; the values' ranges are ``CostWeights``' to check."""
    names = cost_weight_names()
    out: dict[str, float] = {}
    for item in items:
        name, eq, value = item.partition("=")
        name = name.strip()
        if not eq or name not in names:
            raise ValueError(f"cost weight {item!r}: expected NAME=VALUE with NAME one of "
                             f"{', '.join(names)}")
        try:
            out[name] = float(value)
        except ValueError:
            raise ValueError(f"cost weight {item!r}: {value.strip()!r} is not a number"
                             ) from None
    return out


@dataclass(frozen=True)
class ServiceConfig:
    """Everything the service reads at start.

    Invariants: ``liveness_timeout_s > heartbeat_interval_s``; ``purge_after_s >=
    liveness_timeout_s`` (a worker leaves routing first, its entries go later);
    ``backend == "redis"`` needs ``redis_url``.
    """

    backend: str = "memory"
    # Secrets stay out of repr(), so a logged or printed config never shows them.
    redis_url: str | None = field(default=None, repr=False)  # may hold a password
    redis_timeout_s: float = 0.5          # socket timeout of every Redis call
    redis_cluster: bool = False           # redis_url names a node of a Redis Cluster (as a
                                          # redis+cluster:// URL does)
    policy: str = "kvmesh"                # default when a RouteRequest names none
    weights: CostWeights = field(default_factory=CostWeights)
    hash_seed: str = DEFAULT_SEED         # root hash = none_hash(algo, hash_seed); the CLI
                                          # sets it with kvmesh.hashing.resolve_seed
    token: str | None = field(default=None, repr=False)  # router token: Route/Stats only
    worker_token: str | None = field(default=None, repr=False)  # shared, unbound worker token
    worker_secret: str | None = field(default=None, repr=False)  # mints id-bound tokens
    admin_token: str | None = field(default=None, repr=False)  # pins and tenant quotas only
    heartbeat_interval_s: float = 1.0
    liveness_timeout_s: float = 3.0       # no heartbeat for this long: out of routing
    purge_after_s: float = 10.0           # no heartbeat for this long: the janitor purges
    janitor_interval_s: float = 1.0
    refresh_interval_s: float = 0.25      # how often a replica re-reads the worker records
    degraded_retry_s: float = 0.5         # after an index error, answer degraded this long
    provisional_ttl_s: float = 2.0
    pin_ttl_s: float = 600.0              # a PinPrefix without ttl_s; refreshed by use
    max_pin_ttl_s: float = 86_400.0
    pin_timeout_s: float = 30.0           # one worker's Pin call (a warm one prefills first)
    # A Route that finds no live worker re-reads the records (workers may have registered
    # through another replica), at most this often: a flood of routes for an unserved model
    # must not become a flood of reads.
    forced_refresh_min_s: float = 0.05
    # Hashing work (blocks x (1 + multimodal items): every block checks every item) from which
    # a Route hashes in a worker thread, so the loop keeps answering heartbeats meanwhile.
    # ~4096 blocks of plain prompt hash in a few ms: below that a thread costs more than it saves.
    hash_thread_work: int = 4096
    max_prompt_tokens: int = 1_000_000
    max_salt_bytes: int = 4096
    # One PublishEvents is one Redis script, which blocks Redis while it runs and must end
    # well within redis_timeout_s: measured on Valkey 8 (loaded 2-core host), 8192 hashes
    # ~0.1 s, 16384 ~0.5 s, 65536 ~1.8 s. (The worker's link batches at most 8192 too.)
    max_batch_events: int = 4096
    max_batch_hashes: int = 8192          # block hashes in one PublishEvents
    max_snapshot_blocks: int = 400_000    # ~34 bytes each on the wire: fits 16 MiB
    max_message_bytes: int = 16 * 1024 * 1024  # also gRPC's receive limit (kvmesh.rpc.limits)
    max_mm_items: int = 64                # multimodal items of one Route (hashing cost is
                                          # blocks x items)
    indexed_blocks_per_pool: int = 4      # a worker may index at most this many times the
    min_indexed_cap: int = 1024           # total_blocks it reports, and at least this many
    max_inflight_per_conn: int = 1024     # calls in flight per client connection; 0: no cap
    metrics_port: int | None = None
    metrics_host: str = "127.0.0.1"
    tls_cert_file: str | None = None      # both set: the port is served with TLS
    tls_key_file: str | None = None
    tls_ca_file: str | None = None        # with tls_client_auth: CA of client certificates
    tls_client_auth: bool = False         # require client certificates (mutual TLS)
    route_log: str | None = None          # a JSON line per routing decision (service.
                                          # route_log); None: off, and nothing is paid
    # Peer KV fetch (service.policy.fetch): off until `kvmesh bench replay --peer-fetch` and
    # `kvmesh bench e2e` show it wins (docs/architecture.md, "Peer KV transfer").
    peer_fetch: bool = False
    min_fetch_blocks: int = 4             # plan a fetch only for at least this many blocks
    fetch_ticket_ttl_s: float = 30.0      # a planned fetch's ticket expires this much later
    # Tenant quotas (service.quotas): written to the store at start, overriding those
    # tenants' stored quotas; each a fraction of every tier.
    tenant_quotas: tuple[tuple[str, float], ...] = ()  # (tenant, fraction)
    default_tenant_quota: float | None = None
    quota_refresh_s: float = 1.0          # a replica re-reads the stored quotas this often

    def __post_init__(self) -> None:
        if self.backend not in BACKENDS:
            raise ValueError(f"backend must be one of {BACKENDS}, got {self.backend!r}")
        if self.backend == "redis" and not self.redis_url:
            raise ValueError("backend 'redis' needs redis_url")
        if self.redis_cluster and self.backend != "redis":
            raise ValueError("redis_cluster needs backend 'redis'")
        if self.policy not in POLICIES:
            raise ValueError(f"policy must be one of {POLICIES}, got {self.policy!r}")
        if not 0 < self.heartbeat_interval_s < self.liveness_timeout_s <= self.purge_after_s:
            raise ValueError("need 0 < heartbeat_interval_s < liveness_timeout_s <= "
                             "purge_after_s")
        if (self.tls_cert_file is None) != (self.tls_key_file is None):
            raise ValueError("TLS needs both tls_cert_file and tls_key_file")
        if self.tls_client_auth and (self.tls_ca_file is None or self.tls_cert_file is None):
            raise ValueError("tls_client_auth needs tls_ca_file and a server certificate")
        if self.worker_secret is not None and len(self.worker_secret.encode()) < 16:
            raise ValueError("worker_secret must be at least 16 bytes")
        from service.auth import check_credentials  # lazily: it imports grpc

        check_credentials(self.token, self.worker_token, self.worker_secret, self.admin_token)
        limits = ("max_prompt_tokens", "max_salt_bytes", "max_batch_events",
                  "max_batch_hashes", "max_snapshot_blocks", "max_message_bytes",
                  "max_mm_items", "indexed_blocks_per_pool", "min_indexed_cap",
                  "hash_thread_work", "min_fetch_blocks")
        for name in limits:
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1")
        if not 0 < self.pin_ttl_s <= self.max_pin_ttl_s or self.pin_timeout_s <= 0:
            raise ValueError("need 0 < pin_ttl_s <= max_pin_ttl_s and pin_timeout_s > 0")
        if self.forced_refresh_min_s < 0:
            raise ValueError("forced_refresh_min_s must be >= 0")
        if self.max_inflight_per_conn < 0:
            raise ValueError("max_inflight_per_conn must be >= 0 (0: unlimited)")
        if not 0 < self.fetch_ticket_ttl_s <= 3600:
            raise ValueError("fetch_ticket_ttl_s must be in (0, 3600] seconds")
        self._check_quotas()

    def _check_quotas(self) -> None:
        from kvmesh.quota import check_fraction, check_tenant

        if self.default_tenant_quota is not None:
            check_fraction(self.default_tenant_quota, "the default tenant quota")
        for name, fraction in self.tenant_quotas:
            check_tenant(name)
            check_fraction(fraction, f"the quota of tenant {name!r}")
        if not 0 < self.quota_refresh_s <= 60:
            raise ValueError("quota_refresh_s must be in (0, 60] seconds")

    def indexed_cap(self, total_blocks: int) -> int:
        """The most blocks a worker reporting a pool of ``total_blocks`` may have indexed."""
        return max(self.indexed_blocks_per_pool * total_blocks, self.min_indexed_cap)

    @property
    def fetch_costs(self) -> FetchCosts:
        """The kvmesh policy's peer-fetch settings (``--peer-fetch``, ``--min-fetch-blocks``)."""
        from service.policy.fetch import FetchCosts  # lazily: service.policy imports this module

        return FetchCosts(enabled=self.peer_fetch, min_fetch_blocks=self.min_fetch_blocks)

    @property
    def tls(self) -> TlsFiles | None:
        """The server's TLS settings, or ``None`` for plaintext."""
        if self.tls_cert_file is None:
            return None
        from kvmesh.rpc.tls import TlsFiles

        return TlsFiles(cert=self.tls_cert_file, key=self.tls_key_file, ca=self.tls_ca_file,
                        client_auth=self.tls_client_auth)
