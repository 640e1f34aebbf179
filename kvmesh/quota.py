"""Tenants and their cache quotas: the names and rules every layer shares.

A tenant is an opaque label a request carries beside its salt (``RouteRequest.tenant``,
``GenerateRequest.tenant``): it decides whom a cached block is charged to, never what may be
shared (salts alone decide that) and never a block hash. A quota is a tenant's share of each
KV tier of every worker, a fraction of the tier's blocks: a default for every tenant
(``ALL_TENANTS``) plus per-tenant overrides, tier by tier. With no quota set anywhere
(``Quotas.empty``) a worker's pool evicts exactly as vLLM's does.

The service stores one :class:`Quotas` in the index's store; a worker applies the one its
heartbeat answer carries when the answer's ``version`` differs from its own.

See docs/architecture.md#per-tenant-quotas.
"""
from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from dataclasses import dataclass, field

from kvmesh.contract import TIERS
from kvmesh.v1 import index_pb2 as pb

DEFAULT_TENANT = "default"  # requests that name no tenant
ALL_TENANTS = "*"           # the quota name of the default every tenant gets
OTHER = "(other)"           # metrics and stats label of tenants past TOP_TENANTS
TOP_TENANTS = 8             # per-tenant label values a worker exports (cardinality bound)
MAX_TENANT_BYTES = 64
MAX_QUOTA_TENANTS = 1024    # per-tenant overrides the service keeps


def check_tenant(name: str) -> str:
    """``name`` as the tenant it names: ``""`` is :data:`DEFAULT_TENANT`. Raises
    ``ValueError`` with a message a caller can act on for anything else a label must not be
    (too long, control characters or spaces, a reserved name)."""
    if not name:
        return DEFAULT_TENANT
    if len(name.encode()) > MAX_TENANT_BYTES:
        raise ValueError(f"tenant is {len(name.encode())} bytes; the limit is "
                         f"{MAX_TENANT_BYTES}")
    if not name.isprintable() or any(c.isspace() for c in name):
        raise ValueError(f"tenant {name!r} has spaces or control characters")
    if name in (ALL_TENANTS, OTHER):
        raise ValueError(f"tenant {name!r} is reserved")
    return name


def check_fraction(value: float, what: str = "quota") -> float:
    """``value`` if it is a fraction in [0, 1], else ``ValueError``."""
    if not 0.0 <= value <= 1.0:  # NaN fails both
        raise ValueError(f"{what} must be a fraction in [0, 1], got {value}")
    return float(value)


@dataclass(frozen=True)
class Quota:
    """A share of each tier; ``None``: not set here (the default's applies)."""

    gpu: float | None = None
    cpu: float | None = None
    disk: float | None = None

    def __post_init__(self) -> None:
        for tier in TIERS:
            value = getattr(self, tier)
            if value is not None:
                check_fraction(value, f"the {tier} quota")

    def get(self, tier: str) -> float | None:
        return getattr(self, tier)

    @property
    def empty(self) -> bool:
        return all(self.get(t) is None for t in TIERS)

    @classmethod
    def uniform(cls, fraction: float) -> Quota:
        """The same share of every tier (``kvmesh up --tenant-quota NAME=FRACTION``)."""
        return cls(*(fraction for _ in TIERS))


@dataclass(frozen=True)
class Quotas:
    """Every quota in force: ``default`` (every tenant) and per-tenant overrides."""

    default: Quota = Quota()
    tenants: Mapping[str, Quota] = field(default_factory=dict)

    def fraction(self, tenant: str, tier: str) -> float | None:
        """``tenant``'s share of ``tier``: its own if set there, else the default's;
        ``None``: no limit."""
        own = self.tenants.get(tenant)
        value = own.get(tier) if own is not None else None
        return self.default.get(tier) if value is None else value

    @property
    def empty(self) -> bool:
        """No quota anywhere: pools evict exactly as vLLM's."""
        return self.default.empty and all(q.empty for q in self.tenants.values())

    @property
    def version(self) -> int:
        """A non-zero 64-bit digest of the contents; 0 when :attr:`empty`."""
        if self.empty:
            return 0
        rows = [[ALL_TENANTS, *(self.default.get(t) for t in TIERS)]]
        rows += [[name, *(q.get(t) for t in TIERS)] for name, q in sorted(self.tenants.items())]
        digest = hashlib.sha256(json.dumps(rows).encode()).digest()
        return int.from_bytes(digest[:8], "big") | 1

    def with_quota(self, tenant: str, quota: Quota | None) -> Quotas:
        """These quotas with ``tenant``'s (``ALL_TENANTS``: the default) set to ``quota``,
        or removed when ``quota`` is ``None`` or empty."""
        if tenant == ALL_TENANTS:
            return Quotas(quota or Quota(), dict(self.tenants))
        tenants = dict(self.tenants)
        tenants.pop(check_tenant(tenant), None)
        if quota is not None and not quota.empty:
            if len(tenants) >= MAX_QUOTA_TENANTS:
                raise ValueError(f"at most {MAX_QUOTA_TENANTS} tenants may have a quota of "
                                 "their own; clear one first, or set the default ('*')")
            tenants[tenant] = quota
        return Quotas(self.default, tenants)

    def to_proto(self) -> pb.TenantQuotas:
        return pb.TenantQuotas(
            default_quota=quota_to_proto(ALL_TENANTS, self.default),
            tenants=[quota_to_proto(n, q) for n, q in sorted(self.tenants.items())],
            version=self.version)

    @classmethod
    def from_proto(cls, msg: pb.TenantQuotas) -> Quotas:
        """Raises ``ValueError`` on a tenant name or fraction a quota cannot have."""
        tenants = {check_tenant(m.tenant): quota_from_proto(m) for m in msg.tenants}
        return cls(quota_from_proto(msg.default_quota), tenants)


def quota_to_proto(tenant: str, quota: Quota) -> pb.TenantQuota:
    return pb.TenantQuota(tenant=tenant, **{t: quota.get(t) for t in TIERS
                                            if quota.get(t) is not None})


def quota_from_proto(msg: pb.TenantQuota) -> Quota:
    """Raises ``ValueError`` on a fraction outside [0, 1]."""
    return Quota(**{t: getattr(msg, t) for t in TIERS if msg.HasField(t)})


def parse_assignment(text: str) -> tuple[str, float]:
    """``"NAME=FRACTION"`` as ``(tenant, fraction)``; ``ValueError`` otherwise."""
    name, sep, value = text.partition("=")
    if not sep:
        raise ValueError(f"expected NAME=FRACTION, got {text!r}")
    try:
        fraction = float(value)
    except ValueError:
        raise ValueError(f"expected NAME=FRACTION, got {text!r}") from None
    return check_tenant(name), check_fraction(fraction)
