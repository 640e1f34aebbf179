"""SetTenantQuota / GetTenantQuotas, and the quotas each heartbeat answer carries.

Quotas live in the index's store (``IndexBackend.quotas`` / ``set_quota``), shared by every
replica. :class:`QuotaBook` keeps this replica's copy for the heartbeats: it re-reads the
store at most every ``ServiceConfig.quota_refresh_s`` (a heartbeat never waits on more than
one read, and never fails for a quota read), so a change made through any replica reaches
every worker within about that plus one heartbeat. A heartbeat answer carries the quotas
only when the worker's ``quota_version`` differs from theirs (no quotas: ``TenantQuotas``
with version 0). A change through this replica refreshes its copy at once.

Validation: the tenant is a ``kvmesh.quota.check_tenant`` name or ``ALL_TENANTS`` ("*", the
default of every tenant); a set names at least one tier, each a fraction in [0, 1]; a clear
names none. Anything else is INVALID_ARGUMENT (``RequestError``), changing nothing. A set
replaces the tenant's whole quota (tiers it leaves out fall back to the default's).

See docs/architecture.md#per-tenant-quotas-setting-them.
"""
from __future__ import annotations

import asyncio
import logging

import grpc

from kvmesh.contract import TIERS
from kvmesh.quota import ALL_TENANTS, MAX_QUOTA_TENANTS, Quota, Quotas, check_tenant
from kvmesh.v1 import index_pb2 as pb
from service.clock import Clock
from service.config import ServiceConfig
from service.index.base import IndexBackend, IndexUnavailable
from service.validate import RequestError

log = logging.getLogger("kvmesh.service")
INVALID = grpc.StatusCode.INVALID_ARGUMENT


def quota_change(req: pb.SetTenantQuotaRequest) -> tuple[str, Quota | None]:
    """(tenant, its new quota; None: clear it) of a valid request, else ``RequestError``."""
    name = req.quota.tenant
    if not name:
        raise RequestError(INVALID, "quota.tenant is empty: name a tenant, or '*' for the "
                           "default quota of every tenant")
    try:
        tenant = name if name == ALL_TENANTS else check_tenant(name)
    except ValueError as e:
        raise RequestError(INVALID, f"quota.tenant: {e}") from None
    given = {t: getattr(req.quota, t) for t in TIERS if req.quota.HasField(t)}
    if req.clear:
        if given:
            raise RequestError(INVALID, f"clear takes no fractions (got {', '.join(given)}): "
                               "clear the quota, or set it")
        return tenant, None
    if not given:
        raise RequestError(INVALID, "give at least one of quota.gpu, quota.cpu, quota.disk "
                           "(a fraction of the tier in [0, 1]), or clear")
    try:
        return tenant, Quota(**given)
    except ValueError as e:
        raise RequestError(INVALID, f"quota of {tenant!r}: {e}") from None


def start_quotas(cfg: ServiceConfig) -> list[tuple[str, Quota]]:
    """The quotas the service's flags set at start (``--default-tenant-quota``, then each
    ``--tenant-quota NAME=FRACTION``, every tier alike)."""
    out = [] if cfg.default_tenant_quota is None else [
        (ALL_TENANTS, Quota.uniform(cfg.default_tenant_quota))]
    return out + [(name, Quota.uniform(f)) for name, f in cfg.tenant_quotas]


class QuotaBook:
    """This replica's view of the stored quotas (see the module docstring)."""

    def __init__(self, cfg: ServiceConfig, backend: IndexBackend, clock: Clock) -> None:
        self.backend = backend
        self.clock = clock
        self.refresh_ms = int(cfg.quota_refresh_s * 1000)
        self._msg: pb.TenantQuotas | None = None  # None: not read yet
        self._read_ms = 0
        self._lock = asyncio.Lock()
        self._start = start_quotas(cfg)  # written at start; kept until the store took them

    def _keep(self, quotas: Quotas) -> pb.TenantQuotas:
        self._msg = quotas.to_proto()
        self._read_ms = self.clock()
        return self._msg

    async def write_start(self) -> None:
        """Store the start flags' quotas (overriding those tenants' stored ones); raises
        ``IndexUnavailable`` until the store takes them (the server retries)."""
        while self._start:
            tenant, quota = self._start[0]
            self._keep(await self.backend.set_quota(tenant, quota))
            self._start.pop(0)
            log.info("tenant quota of %r set at start: %s", tenant, quota)

    @property
    def starting(self) -> bool:
        """The start flags' quotas are not all stored yet."""
        return bool(self._start)

    async def current(self) -> pb.TenantQuotas | None:
        """The quotas for a heartbeat answer: this replica's copy, re-read when older than
        the refresh interval; None when the store was never read (it is down)."""
        if self._msg is not None and self.clock() - self._read_ms < self.refresh_ms:
            return self._msg
        async with self._lock:  # one read for every heartbeat that finds the copy stale
            if self._msg is None or self.clock() - self._read_ms >= self.refresh_ms:
                try:
                    self._keep(await self.backend.quotas())
                except IndexUnavailable as e:
                    self._read_ms = self.clock()  # keep the old copy; retry next interval
                    log.debug("tenant quotas not re-read: %s", e)
        return self._msg

    async def get(self) -> pb.GetTenantQuotasResponse:
        """GetTenantQuotas: read from the store (what every replica serves)."""
        return pb.GetTenantQuotasResponse(quotas=self._keep(await self.backend.quotas()))

    async def set(self, req: pb.SetTenantQuotaRequest) -> pb.SetTenantQuotaResponse:
        """SetTenantQuota: validate, store, answer every quota after the change."""
        tenant, quota = quota_change(req)
        if quota is not None and tenant != ALL_TENANTS:
            stored = await self.backend.quotas()
            if tenant not in stored.tenants and len(stored.tenants) >= MAX_QUOTA_TENANTS:
                raise RequestError(grpc.StatusCode.RESOURCE_EXHAUSTED, (
                    f"{len(stored.tenants)} tenants have a quota of their own, the limit: "
                    "clear one first, or set the default ('*')"))
        quotas = await self.backend.set_quota(tenant, quota)
        log.info("tenant quota of %r %s", tenant, "cleared" if quota is None else f"set: {quota}")
        return pb.SetTenantQuotaResponse(quotas=self._keep(quotas))
