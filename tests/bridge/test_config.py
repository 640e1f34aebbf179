"""Engines and their ranks: worker ids, DP port offsets, addresses, config files, LoRA maps."""
from __future__ import annotations

import logging

import pytest

from bridge.config import (
    EngineSpec,
    check_unique,
    host_port,
    load_config,
    offset_port,
    parse_loras,
    ranks,
)


def spec(**kw) -> EngineSpec:
    base = dict(worker_id="e", address="http://10.0.0.5:8000", events="tcp://10.0.0.5:5557")
    return EngineSpec(**{**base, **kw})


def test_one_rank_keeps_the_id_and_ports() -> None:
    (r,) = ranks(spec(replay="tcp://10.0.0.5:5558"))
    assert (r.worker_id, r.events, r.replay) == ("e", "tcp://10.0.0.5:5557",
                                                 "tcp://10.0.0.5:5558")
    assert r.address == "http://10.0.0.5:8000" and r.metrics_url == "http://10.0.0.5:8000/metrics"


def test_the_registered_address_says_http_engine() -> None:
    assert [r.address for r in ranks(spec(address="https://g:8443"))] == ["https://g:8443"]
    assert [r.address for r in ranks(spec(address="g:8000"))] == ["http://g:8000"]


def test_data_parallel_ranks_offset_both_ports_as_vllm_does() -> None:
    rs = ranks(spec(dp_ranks=3, replay="tcp://10.0.0.5:6000", metrics_url="http://m:9/x",
                    service_token=("t0", "t1", "t2")))
    assert [r.worker_id for r in rs] == ["e-dp0", "e-dp1", "e-dp2"]
    assert [r.events for r in rs] == [f"tcp://10.0.0.5:{5557 + i}" for i in range(3)]
    assert [r.replay for r in rs] == [f"tcp://10.0.0.5:{6000 + i}" for i in range(3)]
    assert {r.address for r in rs} == {"http://10.0.0.5:8000"}
    assert rs[2].metrics_url == "http://m:9/x"
    assert [r.rank for r in rs] == [0, 1, 2] and [r.service_token for r in rs] == [
        "t0", "t1", "t2"]


@pytest.mark.parametrize("url, want", [
    ("http://h:8000", "h:8000"), ("h:8000", "h:8000"), ("https://h", "h:443"),
    ("http://h/v1", "h:80"), ("http://[::1]:8000", "[::1]:8000")])
def test_host_port(url: str, want: str) -> None:
    assert host_port(url) == want


@pytest.mark.parametrize("bad", [
    dict(address="http://"), dict(dp_ranks=2, events="ipc:///tmp/kv"), dict(block_size=0),
    dict(dp_ranks=2, service_token=("only-one",))])
def test_bad_engines_are_refused(bad: dict) -> None:
    with pytest.raises(ValueError):
        spec(**bad)
    assert offset_port("ipc:///tmp/kv", 0) == "ipc:///tmp/kv"


def test_loras() -> None:
    assert parse_loras(["a=/p/a", "b=/p/b=x"]) == {"a": "/p/a", "b": "/p/b=x"}
    assert parse_loras({"a": "/p"}) == {"a": "/p"} and parse_loras(None) == {}
    for bad in (["a"], ["=/p"], ["a="], ["a=/p", "a=/q"]):
        with pytest.raises(ValueError):
            parse_loras(bad)


def test_a_worker_id_or_endpoint_bridged_twice_is_refused() -> None:
    with pytest.raises(ValueError, match="twice"):
        check_unique([spec(dp_ranks=2), spec(worker_id="f", events="tcp://10.0.0.5:5558")])
    with pytest.raises(ValueError, match="twice"):
        check_unique([spec(dp_ranks=2), spec(worker_id="e-dp1", events="tcp://x:1")])


def test_toml_and_yaml_configs(tmp_path) -> None:
    toml = tmp_path / "fleet.toml"
    toml.write_text('service = "s1:1,s2:2"\nhash-algo = "sha256"\n'
                    '[[engines]]\nworker-id = "a"\naddress = "http://a:8000"\n'
                    'events = "tcp://a:5557"\nlora = ["x=/l/x"]\ndp_ranks = 2\n'
                    '[[engines]]\nworker_id = "b"\naddress = "b:8000"\nevents = "tcp://b:5557"\n'
                    'block-size = 32\nservice-token = "tb"\n')
    top, engines = load_config(toml)
    assert top == {"service": "s1:1,s2:2", "hash_algo": "sha256"}
    assert engines[0].lora == {"x": "/l/x"} and engines[0].dp_ranks == 2
    assert engines[1].block_size == 32 and engines[1].service_token == "tb"
    yml = tmp_path / "fleet.yaml"
    yml.write_text("engines:\n  - worker-id: a\n    address: http://a:8000\n"
                   "    events: tcp://a:5557\n    lora: {x: /l/x}\n"
                   "    service-token: [t0, t1]\n    dp-ranks: 2\n")
    _, (a,) = load_config(yml)
    assert a.lora == {"x": "/l/x"} and a.service_token == ("t0", "t1")


@pytest.mark.parametrize("text, match", [
    ("[[engines]]\nworker-id = 'a'\n", "engines\\[0\\]"),        # address, events missing
    ("[[engines]]\nworker-id = 'a'\nadress = 'x'\n", "unknown"),  # a typo is not ignored
    ("nope = 1\nengines = []\n", "unknown"),
    ("engines = 3\n", "engines"),
    ("[[engines]]\nworker-id = 'a'\naddress = 'a:1'\nevents = 'tcp://a:2'\n"
     "block-size = '16'\n", "block_size must be an integer"),
    ("[[engines]]\nworker-id = 7\naddress = 'a:1'\nevents = 'tcp://a:2'\n", "worker_id"),
    ("engines = [", "bad.toml"),
])
def test_bad_configs_say_what_is_wrong(tmp_path, text: str, match: str) -> None:
    path = tmp_path / "bad.toml"
    path.write_text(text)
    with pytest.raises(ValueError, match=match):
        load_config(path)


@pytest.mark.parametrize("mode,tokens,warned", [
    (0o644, True, True), (0o640, True, True), (0o600, True, False), (0o644, False, False)])
def test_a_config_holding_tokens_readable_by_others_is_warned_about(
        tmp_path, caplog: pytest.LogCaptureFixture, mode: int, tokens: bool,
        warned: bool) -> None:
    """Service tokens in a ``--config`` file others can read are
    warned about as ``--tenant-keys`` files are (a file without tokens holds no secret)."""
    path = tmp_path / "fleet.toml"
    token = 'service-token = "kvw1.secret"\n' if tokens else ""
    path.write_text(f'{token}[[engines]]\nworker-id = "a"\naddress = "http://h:8000"\n'
                    'events = "tcp://h:5557"\n')
    path.chmod(mode)
    with caplog.at_level(logging.WARNING, logger="kvmesh.ops.file_perms"):
        top, engines = load_config(path)
    assert [e.worker_id for e in engines] == ["a"]
    hits = [r.getMessage() for r in caplog.records if "readable by other users" in r.getMessage()]
    assert len(hits) == warned, caplog.text
    assert all("--config" in m and str(path) in m and "kvw1.secret" not in m for m in hits)
