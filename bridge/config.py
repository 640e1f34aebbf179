"""What the bridge bridges: engines (from flags or a config file) and their ranks.

An engine is one vLLM deployment (API server URL, event and replay endpoints, ``/metrics``);
rank r of ``dp_ranks`` > 1 publishes on the ports + r and registers as ``ID-dp{r}``. A config
file (YAML or TOML) holds ``engines`` and the process-wide flags; the command line wins.

See docs/architecture.md#bridge-configuration-and-load.
"""
from __future__ import annotations

import tomllib
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from kvmesh.ops.file_perms import warn_if_readable_by_others
from kvmesh.rpc.engine_address import http_address

GLOBAL_KEYS = ("service", "service_token", "hash_algo", "hash_seed", "tls_ca", "tls_cert",
               "tls_key", "metrics_port", "metrics_host", "curve_key")


@dataclass(frozen=True)
class EngineSpec:
    worker_id: str
    address: str                  # the engine's OpenAI server: http://host:port
    events: str                   # rank 0's KV-event PUB endpoint: tcp://host:5557
    replay: str | None = None     # rank 0's replay ROUTER endpoint: tcp://host:5558
    model: str | None = None      # None: the model_name label of the engine's metrics
    block_size: int = 16
    dp_ranks: int = 1
    metrics_url: str | None = None  # None: {address}/metrics
    lora: Mapping[str, str] = field(default_factory=dict)
    num_blocks: int | None = None   # GPU blocks, when the metrics do not say
    topic: str = ""
    # this engine's own credential: one token, or one per rank (tokens bound to worker ids)
    service_token: str | tuple[str, ...] | None = None
    # the engine's CURVE public key (Z85, or its NAME.key file): its event sockets are CURVE
    # servers (kvmesh.events.zmq_curve); the bridge presents --curve-key
    curve_server_key: str | None = None

    def __post_init__(self) -> None:
        for name in ("worker_id", "address", "events"):
            if not isinstance(getattr(self, name), str) or not getattr(self, name):
                raise ValueError(f"{name} must be a non-empty string")
        for name in ("replay", "model", "metrics_url", "curve_server_key"):
            if getattr(self, name) is not None and not isinstance(getattr(self, name), str):
                raise ValueError(f"{self.worker_id}: {name} must be a string")
        for name in ("block_size", "dp_ranks", "num_blocks"):
            value = getattr(self, name)
            if (value is not None or name != "num_blocks") and (
                    not isinstance(value, int) or isinstance(value, bool)):
                raise ValueError(f"{self.worker_id}: {name} must be an integer")
        if self.block_size < 1 or self.dp_ranks < 1:
            raise ValueError(f"{self.worker_id}: block_size and dp_ranks must be >= 1")
        host_port(self.address)
        if isinstance(self.service_token, tuple) and len(self.service_token) != self.dp_ranks:
            raise ValueError(f"{self.worker_id}: {len(self.service_token)} service tokens for "
                             f"{self.dp_ranks} ranks")
        for r in range(self.dp_ranks):
            offset_port(self.events, r)
            if self.replay is not None:
                offset_port(self.replay, r)


@dataclass(frozen=True)
class RankSpec:
    engine: EngineSpec
    rank: int
    worker_id: str
    events: str
    replay: str | None
    address: str      # http://host:port, as the index stores it
    metrics_url: str
    service_token: str | None  # None: the process-wide one


def host_port(url: str) -> str:
    """``host:port`` of an engine URL (``http://h:8000``; no scheme: http; no port: the
    scheme's). ``ValueError`` without a host."""
    parts = urlsplit(url if "//" in url else f"http://{url}")
    if not parts.hostname:
        raise ValueError(f"engine address {url!r} has no host (expected http://HOST:PORT)")
    port = parts.port or (443 if parts.scheme == "https" else 80)
    host = f"[{parts.hostname}]" if ":" in parts.hostname else parts.hostname
    return f"{host}:{port}"


def offset_port(endpoint: str, offset: int) -> str:
    """A ``tcp://host:port`` endpoint with its port moved by ``offset`` (a DP rank)."""
    if offset == 0:
        return endpoint
    base, _, port = endpoint.rpartition(":")
    if not endpoint.startswith("tcp://") or not port.isdigit():
        raise ValueError(f"endpoint {endpoint!r}: data-parallel ranks need tcp://HOST:PORT")
    return f"{base}:{int(port) + offset}"


def ranks(spec: EngineSpec) -> list[RankSpec]:
    """The workers of one engine, one per data-parallel rank."""
    parts = urlsplit(spec.address if "//" in spec.address else f"http://{spec.address}")
    metrics = spec.metrics_url or f"{parts.scheme}://{parts.netloc}/metrics"
    address = http_address(host_port(spec.address), tls=parts.scheme == "https")
    tokens = spec.service_token
    return [RankSpec(spec, r, spec.worker_id if spec.dp_ranks == 1 else f"{spec.worker_id}-dp{r}",
                     offset_port(spec.events, r),
                     None if spec.replay is None else offset_port(spec.replay, r),
                     address, metrics,
                     tokens[r] if isinstance(tokens, tuple) else tokens)
            for r in range(spec.dp_ranks)]


def parse_loras(items: Iterable[str] | Mapping[str, str] | None) -> dict[str, str]:
    """``NAME=PATH`` strings (or a mapping) as ``{name: path}``."""
    if items is None:
        return {}
    if isinstance(items, Mapping):
        return {str(k): str(v) for k, v in items.items()}
    out: dict[str, str] = {}
    for item in items:
        name, sep, path = str(item).partition("=")
        if not sep or not name or not path:
            raise ValueError(f"--lora {item!r}: expected NAME=PATH")
        if out.get(name, path) != path:
            raise ValueError(f"--lora {name}: two paths for one adapter name")
        out[name] = path
    return out


def _keys(table: Mapping[str, Any], where: str, allowed: Iterable[str]) -> dict[str, Any]:
    out = {str(k).replace("-", "_"): v for k, v in table.items()}
    unknown = set(out) - set(allowed)
    if unknown:
        raise ValueError(f"{where}: unknown keys {sorted(unknown)}")
    return out


def load_config(path: str | Path) -> tuple[dict[str, Any], list[EngineSpec]]:
    """(process-wide settings, engines) of a YAML or TOML config file; ``ValueError`` for a
    file that does not describe engines as above."""
    path = Path(path)
    text = path.read_text()
    if path.suffix in (".toml", ".tml"):
        try:
            doc = tomllib.loads(text)
        except tomllib.TOMLDecodeError as e:
            raise ValueError(f"{path}: {e}") from None
    else:
        try:
            import yaml  # PyYAML: only for YAML configs
        except ImportError:
            raise ValueError(f"{path}: YAML configs need PyYAML (pip install pyyaml); or "
                             "write the config in TOML") from None
        try:
            doc = yaml.safe_load(text)
        except yaml.YAMLError as e:
            raise ValueError(f"{path}: {e}") from None
    if not isinstance(doc, Mapping) or not isinstance(doc.get("engines"), list):
        raise ValueError(f"{path}: expected a table with an 'engines' list")
    top = _keys({k: v for k, v in doc.items() if k != "engines"}, str(path), GLOBAL_KEYS)
    names = [f.name for f in fields(EngineSpec)]
    engines = []
    for i, table in enumerate(doc["engines"]):
        if not isinstance(table, Mapping):
            raise ValueError(f"{path}: engines[{i}] is not a table")
        kw = _keys(table, f"{path}: engines[{i}]", names)
        kw["lora"] = parse_loras(kw.get("lora"))
        if isinstance(kw.get("service_token"), list):
            kw["service_token"] = tuple(str(t) for t in kw["service_token"])
        try:
            engines.append(EngineSpec(**kw))
        except TypeError as e:  # a required key missing
            raise ValueError(f"{path}: engines[{i}]: {e}") from None
    check_unique(engines)
    if top.get("service_token") or any(e.service_token for e in engines):
        warn_if_readable_by_others(path, "--config file (it holds service tokens)")
    return top, engines


def check_unique(engines: list[EngineSpec]) -> None:
    """No two ranks share a worker id or an events endpoint."""
    seen_ids: set[str] = set()
    seen_events: set[str] = set()
    for spec in engines:
        for r in ranks(spec):
            if r.worker_id in seen_ids or r.events in seen_events:
                raise ValueError(f"worker id {r.worker_id!r} or endpoint {r.events!r} is "
                                 "bridged twice")
            seen_ids.add(r.worker_id)
            seen_events.add(r.events)
