"""kvmesh.contract: its names agree with what they name (the proto, the digests, the service's
policies), and no source module types one of its collections again.

The scan reads every ``.py`` file of the source packages with ``ast`` (the generated stubs
under ``kvmesh/v1/`` and the contract itself excepted) and fails on:

- a tuple, list or set literal holding two or more tier names (or eviction orders), or a dict
  literal keyed by two or more of them whose values are all constants or tier enums (a
  table: a dict reading per-tier values from a record is a conversion, not a copy);
- a collection literal of two or more ``TIER_*`` enum values (the name <-> enum map again);
- a string literal that is a hash-algorithm name, or a policy name other than ``kvmesh`` and
  ``random`` (the project's name and a module's: a literal check cannot tell their policy
  use apart, which goes through ``KVMESH`` / ``RANDOM`` / ``DEFAULT_POLICY`` all the same).

``ALLOWLIST`` holds the few literals that name something else; say why for each.
"""
from __future__ import annotations

import ast
from pathlib import Path

import pytest

from kvmesh import contract
from kvmesh.contract import FINGERPRINT_BYTES, kv_fingerprint
from kvmesh.hashing import hash_value
from kvmesh.v1 import index_pb2

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("kvmesh", "worker", "service", "client", "bridge", "deploy", "bench")
SKIP = ("kvmesh/contract.py", "kvmesh/v1/")
# (module path, literal): literals that spell a contract name but mean something else
ALLOWLIST = {
    ("worker/kv_io/disk_store.py", "sha256"):
        "hmac's digest name for the disk files' MACs (HMAC-SHA-256), not a block-hash algo",
}
NAME_SETS = {"tier": set(contract.TIERS), "eviction": set(contract.EVICTIONS)}
LITERALS = {**{a: "hash algorithm" for a in contract.ALGOS},
            **{p: "policy" for p in contract.POLICIES
               if p not in (contract.KVMESH, contract.RANDOM)}}
ENUM_NAMES = {f"TIER_{t.upper()}" for t in contract.TIERS}


def _strings(nodes: list[ast.expr | None]) -> set[str]:
    return {n.value for n in nodes if isinstance(n, ast.Constant) and isinstance(n.value, str)}


def _static(node: ast.expr) -> bool:
    """A table's value: a constant or a tier enum (``pb.TIER_GPU``, ``TIER_GPU``)."""
    return isinstance(node, ast.Constant) or getattr(node, "attr", getattr(node, "id", None)) \
        in ENUM_NAMES


def _enum_refs(nodes: list[ast.expr]) -> int:
    return sum(isinstance(n, ast.Attribute) and n.attr in ENUM_NAMES for n in nodes)


def copies(source: str, rel: str = "<src>") -> list[str]:
    """``path:line: what`` for every re-typed contract name in ``source``."""
    out = []
    for node in ast.walk(ast.parse(source)):
        line = getattr(node, "lineno", 0)
        if isinstance(node, ast.Tuple | ast.List | ast.Set | ast.Dict):
            keys = node.keys if isinstance(node, ast.Dict) else node.elts
            values = node.values if isinstance(node, ast.Dict) else node.elts
            table = not isinstance(node, ast.Dict) or all(map(_static, values))
            for what, names in NAME_SETS.items():
                if table and len(_strings(keys) & names) >= 2:
                    out.append(f"{rel}:{line}: {what} names re-typed (kvmesh.contract has them)")
            if _enum_refs(values) >= 2:
                out.append(f"{rel}:{line}: tier enum map re-typed (kvmesh.contract.TIER_PB)")
        elif isinstance(node, ast.Constant) and node.value in LITERALS.keys():
            if (rel, node.value) not in ALLOWLIST:
                out.append(f"{rel}:{line}: {LITERALS[node.value]} {node.value!r} as a literal")
    return out


def test_no_module_retypes_a_contract_name() -> None:
    found = []
    for pkg in PACKAGES:
        for path in sorted((ROOT / pkg).rglob("*.py")):
            rel = path.relative_to(ROOT).as_posix()
            if not rel.startswith(SKIP):
                found += copies(path.read_text(), rel)
    assert not found, "import these from kvmesh.contract instead:\n" + "\n".join(found)


def test_the_scan_sees_each_kind_of_copy() -> None:
    bad = ['T = ("gpu", "cpu", "disk")', 'x in ["cpu", "disk"]', 'S = {"gpu", "cpu"}',
           'C = {"gpu": "green", "cpu": "blue"}', 'E = ("lru", "layered")',
           'P = (pb.TIER_GPU, pb.TIER_CPU)', 'M = {"a": pb.TIER_GPU, "b": pb.TIER_DISK}',
           'N = {"gpu": TIER_GPU, "disk": TIER_DISK}',
           'algo = "sha256_cbor"', 'D = {"xxhash": 16}', 'policy = "round_robin"',
           'f(name="least_loaded")']
    for src in bad:
        assert copies(src), src
    fine = ['tier == "gpu"', 'd = {t: 0 for t in TIERS}', 'policy = "kvmesh"',
            'r = {"gpu": m.gpu * bs, "cpu": m.cpu * bs}', 'r = {"gpu": v.gpu, "cpu": v.cpu}',
            'x = ("gpu", "gpu+cpu")',
            '"""the tiers gpu, cpu and disk; algo sha256_cbor"""']
    assert [src for src in fine if copies(src)] == []
    # an allowlisted literal passes in its own module only
    assert copies('hmac.digest(k, m, "sha256")', "worker/kv_io/disk_store.py") == []
    assert copies('hmac.digest(k, m, "sha256")', "worker/other.py")


def test_tier_values_are_the_protos() -> None:
    assert contract.TIER_PB == {t: index_pb2.Tier.Value(f"TIER_{t.upper()}")
                                for t in contract.TIERS}
    assert set(index_pb2.Tier.values()) == {0, *contract.TIER_PB.values()}  # 0: unspecified
    assert {contract.PB_TIER[v]: v for v in contract.PB_TIER} == contract.TIER_PB
    assert contract.LOWER_TIERS == contract.TIERS[1:]


def test_digest_sizes_are_what_the_algorithms_make() -> None:
    assert set(contract.DIGEST_BYTES) == set(contract.ALGOS)
    for algo in contract.ALGOS:
        assert len(hash_value(algo, b"x")) == contract.DIGEST_BYTES[algo], algo
    assert contract.DEFAULT_ALGO in contract.ALGOS
    assert contract.CBOR_ALGOS <= set(contract.ALGOS) >= contract.SHA256_ALGOS


def test_policies_are_the_services() -> None:
    from service.policy import make_policies

    assert set(make_policies()) == set(contract.POLICIES)
    assert contract.DEFAULT_POLICY in contract.POLICIES
    assert len(set(contract.POLICIES)) == len(contract.POLICIES)


# --- kvmesh.contract.kv_fingerprint: every input of the KV bytes names another fingerprint;
# equal inputs give equal bytes whatever the order they were written in.

CONFIG = {"num_hidden_layers": 2, "rope_theta": 10000.0, "rms_norm_eps": 1e-6,
          "max_position_embeddings": 2048,
          "rope_scaling": {"rope_type": "default", "factor": 1.0}, "eos_token_ids": (2,)}
BASE = dict(architecture="LlamaForCausalLM", dtype="torch.float32", block_size=16,
            hash_algo="sha256_cbor", root_hash=b"r" * 32, weight_sample=b"w" * 64)


def fp(config=CONFIG, **kw) -> bytes:
    return kv_fingerprint(config, **{**BASE, **kw})


def test_deterministic_and_independent_of_key_order():
    assert len(fp()) == FINGERPRINT_BYTES
    assert fp() == fp(dict(reversed(list(CONFIG.items()))))
    assert fp() == fp({**CONFIG, "eos_token_ids": [2]})  # tuples are JSON arrays


@pytest.mark.parametrize("field, value", [
    ("rope_theta", 500000.0), ("rms_norm_eps", 1e-5), ("max_position_embeddings", 8192),
    ("rope_scaling", {"rope_type": "linear", "factor": 4.0}), ("num_hidden_layers", 3),
    ("a_field_added_later", True)])
def test_any_config_field_changes_it(field, value):
    assert fp({**CONFIG, field: value}) != fp()


@pytest.mark.parametrize("arg, value", [
    ("architecture", "Qwen2ForCausalLM"), ("dtype", "torch.bfloat16"), ("block_size", 8),
    ("hash_algo", "xxhash"), ("root_hash", b"s" * 32), ("weight_sample", b"w" * 63 + b"x")])
def test_every_other_input_changes_it(arg, value):
    assert fp(**{arg: value}) != fp()


def test_bad_input_is_refused():
    with pytest.raises(TypeError):
        fp({**CONFIG, "rope_scaling": object()})
    with pytest.raises(ValueError, match="block_size"):
        fp(block_size=0)
