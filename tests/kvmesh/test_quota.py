"""kvmesh/quota.py: tenant names, fractions, the default-then-override lookup, the version
digest and the wire form."""
from __future__ import annotations

import math

import pytest

from kvmesh.quota import (
    ALL_TENANTS,
    DEFAULT_TENANT,
    MAX_QUOTA_TENANTS,
    OTHER,
    Quota,
    Quotas,
    check_tenant,
    parse_assignment,
)


def test_an_empty_tenant_is_the_default_and_bad_names_are_refused():
    assert check_tenant("") == DEFAULT_TENANT
    assert check_tenant("acme-1") == "acme-1"
    for bad in ("a b", "x\n", "t" * 65, ALL_TENANTS, OTHER):
        with pytest.raises(ValueError):
            check_tenant(bad)


@pytest.mark.parametrize("bad", [-0.1, 1.5, math.nan])
def test_a_fraction_outside_zero_one_is_refused(bad):
    with pytest.raises(ValueError, match="fraction"):
        Quota(gpu=bad)
    with pytest.raises(ValueError):
        parse_assignment(f"a={bad}")


def test_a_tenant_override_wins_tier_by_tier_over_the_default():
    q = Quotas().with_quota(ALL_TENANTS, Quota(gpu=0.5, cpu=0.4)).with_quota("a", Quota(gpu=0.2))
    assert q.fraction("a", "gpu") == 0.2
    assert q.fraction("a", "cpu") == 0.4  # not set for a: the default's
    assert q.fraction("b", "gpu") == 0.5
    assert q.fraction("b", "disk") is None  # no limit
    assert q.with_quota("a", None).fraction("a", "gpu") == 0.5


def test_the_version_is_zero_only_without_quotas_and_follows_the_contents():
    assert Quotas().version == 0 and Quotas().empty
    a = Quotas().with_quota("a", Quota(gpu=0.2))
    b = Quotas().with_quota("a", Quota(gpu=0.3))
    assert a.version not in (0, b.version)
    assert a.version == Quotas().with_quota("a", Quota(gpu=0.2)).version
    assert a.with_quota("a", None).version == 0


def test_the_wire_form_round_trips_and_refuses_what_a_quota_cannot_be():
    q = Quotas(Quota(gpu=0.5), {"a": Quota(cpu=0.1), "b": Quota.uniform(0.25)})
    msg = q.to_proto()
    assert msg.version == q.version and Quotas.from_proto(msg) == q
    assert not msg.tenants[0].HasField("gpu")  # unset stays unset, not 0.0
    msg.tenants[0].cpu = 2.0
    with pytest.raises(ValueError):
        Quotas.from_proto(msg)


def test_the_number_of_overrides_is_bounded():
    q = Quotas(Quota(), {f"t{i}": Quota(gpu=0.1) for i in range(MAX_QUOTA_TENANTS)})
    with pytest.raises(ValueError, match="at most"):
        q.with_quota("one-more", Quota(gpu=0.1))
    assert q.with_quota("t0", Quota(gpu=0.2)).fraction("t0", "gpu") == 0.2  # a change is fine


def test_parse_assignment():
    assert parse_assignment("acme=0.3") == ("acme", 0.3)
    with pytest.raises(ValueError, match="NAME=FRACTION"):
        parse_assignment("acme")
