"""`kvmesh route | generate | stats` through typer's CliRunner against loopback fakes."""
from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from client.cli import app
from client.commands import decode_bytes, encode_text
from kvmesh.rpc.auth import worker_access_token
from kvmesh.v1 import index_pb2
from tests.client.fake_servers import FakeIndex, FakeWorker, candidate, closed_port_address

runner = CliRunner()
WIDE = {"COLUMNS": "200"}


@pytest.fixture
def service(cluster):
    """A fake service routing to two fake workers (the first holds the prefix)."""
    w1, w2 = FakeWorker("w1", cached=2), FakeWorker("w2")
    index = FakeIndex([candidate("w1", cluster.worker(w1), matched=2, cost=3.0),
                       candidate("w2", cluster.worker(w2), cost=9.0)])
    index.stats = index_pb2.StatsResponse(
        workers=[index_pb2.WorkerInfo(worker_id="w1", address=index.candidates[0].address,
                                      alive=True, indexed_blocks=12,
                                      load=index_pb2.WorkerLoad(running=2, waiting=1,
                                                                free_blocks=5,
                                                                total_blocks=64)),
                 index_pb2.WorkerInfo(worker_id="w2", address=index.candidates[1].address,
                                      alive=False)],
        counters={"routes_total": 42.0})
    index.address = cluster.index(index)
    index.workers = (w1, w2)
    return index


def test_text_is_byte_level() -> None:
    ids = encode_text("héllo")
    assert ids == list("héllo".encode()) and decode_bytes([*ids, 300]) == "héllo"


def test_text_matches_the_worker_byte_tokenizer() -> None:
    tokenizer = pytest.importorskip("worker.model.tokenizer")
    assert encode_text("héllo, kv") == tokenizer.ByteTokenizer().encode("héllo, kv")


def test_route_json(service) -> None:
    result = runner.invoke(app, ["route", "--service", service.address, "--tokens", "1,2,3",
                                 "--salt", "t1", "--json"])
    assert result.exit_code == 0, result.output
    out = json.loads(result.stdout)
    assert out["worker_id"] == "w1" and out["matched_tokens"] == 2
    assert [c["worker_id"] for c in out["candidates"]] == ["w1", "w2"]
    assert list(service.routes[-1].token_ids) == [1, 2, 3] and service.routes[-1].salt == "t1"


def test_route_table(service) -> None:
    result = runner.invoke(app, ["route", "--service", service.address, "--tokens", "1,2"],
                           env=WIDE)
    assert result.exit_code == 0, result.output
    assert "w1" in result.stdout and "2/2 prompt tokens cached" in result.stdout


def test_route_shows_matched_tokens_per_tier(cluster) -> None:
    index = FakeIndex([candidate("w1", "127.0.0.1:1", 56, tier=index_pb2.TIER_DISK,
                                 by_tier={"gpu": 16, "cpu": 32, "disk": 8}),
                       candidate("w2", "127.0.0.1:2", 48, by_tier={"gpu": 48})])
    address = cluster.index(index)
    result = runner.invoke(app, ["route", "--service", address, "--tokens", "1,2"], env=WIDE)
    assert result.exit_code == 0, result.output
    rows = {line.split("│")[2].strip(): [cell.strip() for cell in line.split("│")[4:8]]
            for line in result.stdout.splitlines() if line.count("│") > 7}
    assert rows["w1"] == ["56", "16", "32", "8"] and rows["w2"] == ["48", "48", "0", "0"]
    assert "56/2 prompt tokens cached, 32 on cpu, 8 on disk" in result.stdout
    result = runner.invoke(app, ["route", "--service", address, "--tokens", "1", "--json"])
    out = json.loads(result.stdout)
    assert out["matched_tokens_by_tier"] == {"gpu": 16, "cpu": 32, "disk": 8}
    assert out["candidates"][1]["matched_tokens_by_tier"] == {"gpu": 48}


def test_pin_prints_each_worker_and_fails_when_one_did(cluster) -> None:
    index = FakeIndex(token="adm")
    index.pinned = [index_pb2.PinnedWorker(worker_id="w1", pinned_blocks=2)]
    address = cluster.index(index)
    args = ["pin", "--service", address, "--text", "hello, kv!", "--salt", "s1"]
    result = runner.invoke(app, [*args, "--ttl", "30", "--max-workers", "2"],
                           env={"KVMESH_ADMIN_TOKEN": "adm"})
    assert result.exit_code == 0, result.output
    assert "pinned on 1 of 1 workers (prefix of 2 full blocks)" in result.stdout
    assert "w1: 2 blocks pinned" in result.stdout
    sent = index.pins[-1]
    assert list(sent.prefix.token_ids) == list(b"hello, kv!") and sent.prefix.salt == "s1"
    assert (sent.ttl_s, sent.max_workers) == (30.0, 2)
    index.pinned.append(index_pb2.PinnedWorker(worker_id="w2", error="UNAVAILABLE: down"))
    result = runner.invoke(app, [*args, "--unpin", "--admin-token", "adm", "--json"])
    assert result.exit_code == 1 and isinstance(index.pins[-1], index_pb2.UnpinPrefixRequest)
    out = json.loads(result.stdout)
    assert out["workers"][1] == {"worker_id": "w2", "pinned_blocks": 0,
                                 "error": "UNAVAILABLE: down", "chain_blocks": 0,
                                 "cap_reached": False}
    result = runner.invoke(app, args, env={"KVMESH_TOKEN": "router"})  # not the admin token
    assert result.exit_code == 1 and "UNAUTHENTICATED" in result.output


def test_pin_cut_short_by_a_cap_is_reported_and_fails(cluster) -> None:
    """A pin cut by the cap is a failure: a worker whose pin cap stopped the pin says so, and the
    verb exits
    1, instead of a bare "0 blocks pinned" that reads as success."""
    index = FakeIndex(token="adm")
    index.pinned = [index_pb2.PinnedWorker(worker_id="w1", pinned_blocks=4, chain_blocks=10,
                                           cap_reached=True),
                    index_pb2.PinnedWorker(worker_id="w2", pinned_blocks=10, chain_blocks=10)]
    address = cluster.index(index)
    args = ["pin", "--service", address, "--text", "hello, kv!", "--admin-token", "adm"]
    result = runner.invoke(app, args)
    assert result.exit_code == 1, result.output
    assert "w1: pinned 4 of 10 blocks: pin cap reached" in result.stdout
    assert "w2: 10 blocks pinned" in result.stdout
    result = runner.invoke(app, [*args, "--json"])
    out = json.loads(result.stdout)
    assert result.exit_code == 1 and out["workers"][0]["cap_reached"] is True


def test_generate_text_json_with_env_token(cluster) -> None:
    worker = FakeWorker("w1", token=worker_access_token("tok", "w1"))
    index = FakeIndex([candidate("w1", cluster.worker(worker))], token="tok")
    result = runner.invoke(app, ["generate", "--service", cluster.index(index), "--text", "hi",
                                 "--max-tokens", "2", "--json"], env={"KVMESH_TOKEN": "tok"})
    assert result.exit_code == 0, result.output
    out = json.loads(result.stdout)
    assert out["token_ids"] == [100, 101] and out["text"] == "de"
    assert out["worker_id"] == "w1" and out["finish_reason"] == "length"
    assert list(worker.requests[-1].token_ids) == encode_text("hi")


def test_generate_human_output(service) -> None:
    result = runner.invoke(app, ["generate", "--service", service.address, "--tokens", "1,2",
                                 "--max-tokens", "3"])
    assert result.exit_code == 0, result.output
    assert "w1" in result.stdout and "tokens: 100,101,102" in result.stdout


def test_tenant_flag_reaches_route_and_worker(service) -> None:
    for verb in ("route", "generate"):
        result = runner.invoke(app, [verb, "--service", service.address, "--tokens", "1,2",
                                     "--tenant", f"acme-{verb}", "--json"])
        assert result.exit_code == 0, result.output
        assert service.routes[-1].tenant == f"acme-{verb}"
    assert service.workers[0].requests[-1].tenant == "acme-generate"


def test_a_bad_tenant_flag_exits_2_naming_the_rule(service) -> None:
    for verb in ("route", "generate"):
        result = runner.invoke(app, [verb, "--service", service.address, "--tokens", "1",
                                     "--tenant", "two words"])
        assert result.exit_code == 2 and "spaces" in result.stderr, result.output
    assert service.routes == []


def test_stats_json_includes_worker_cache(service) -> None:
    result = runner.invoke(app, ["stats", "--service", service.address, "--json"])
    assert result.exit_code == 0, result.output
    out = json.loads(result.stdout)
    w1, w2 = out["workers"]
    assert (w1["worker_id"], w1["alive"], w1["indexed_blocks"]) == ("w1", True, 12)
    assert w1["worker_stats"]["cache"]["hit_rate"] == 0.75
    assert w2["alive"] is False and w2["worker_stats"] is None
    assert out["counters"] == {"routes_total": 42.0}


def test_stats_table(service) -> None:
    result = runner.invoke(app, ["stats", "--service", service.address], env=WIDE)
    assert result.exit_code == 0, result.output
    for text in ("w1", "w2", "5/64", "2/1", "75.0%", "routes_total", "42"):
        assert text in result.stdout


def test_service_down_is_one_line_error() -> None:
    result = runner.invoke(app, ["stats", "--service", closed_port_address()])
    assert result.exit_code == 1
    assert result.stderr.startswith("error: UNAVAILABLE") and result.stderr.count("\n") == 1
    assert "Traceback" not in result.output and result.stdout == ""


@pytest.mark.parametrize("args", [["--tokens", "1", "--text", "x"], [], ["--tokens", "1,a"]])
def test_bad_prompt_arguments_exit_2(args) -> None:
    result = runner.invoke(app, ["route", "--service", "127.0.0.1:1", *args])
    assert result.exit_code == 2
    assert result.stderr.startswith("error: ")


def test_stats_fits_80_columns_without_truncation(service) -> None:
    """Piped or in an 80-column terminal every cell shows whole (a block per worker)."""
    result = runner.invoke(app, ["stats", "--service", service.address], env={"COLUMNS": "80"})
    assert result.exit_code == 0, result.output
    assert "…" not in result.stdout
    assert max(map(len, result.stdout.splitlines())) <= 80
    for text in ("w1", "w2", "5/64", "2/1", "75.0%", "routes_total",
                 "127.0.0.1:"):
        assert text in result.stdout


def test_print_stats_keeps_the_wide_table_when_it_fits(service) -> None:
    from io import StringIO

    from rich.console import Console

    from client.commands import print_stats

    out = StringIO()
    data = {"service": "s", "workers": [{"worker_id": "w1", "address": "127.0.0.1:5000",
                                         "alive": True}], "counters": {}}
    print_stats(data, Console(file=out, width=200))
    assert "hit rate" in out.getvalue() and "…" not in out.getvalue()
    narrow = StringIO()
    print_stats(data, Console(file=narrow, width=80))
    assert "127.0.0.1:5000" in narrow.getvalue() and "…" not in narrow.getvalue()


def test_generate_text_notes_the_random_tiny_model(service) -> None:
    result = runner.invoke(app, ["generate", "--service", service.address, "--text", "hi",
                                 "--max-tokens", "2"])
    assert result.exit_code == 0, result.output
    assert "text: " in result.stdout
    assert "note: " in result.stderr and "'tiny'" in result.stderr and "random" in result.stderr


def test_generate_tokens_has_no_model_note(service) -> None:
    result = runner.invoke(app, ["generate", "--service", service.address, "--tokens", "1,2",
                                 "--max-tokens", "2"])
    assert result.exit_code == 0, result.output
    assert result.stderr == ""


def test_policy_choices_come_from_the_contract_list() -> None:
    from kvmesh.contract import POLICIES

    result = runner.invoke(app, ["route", "--service", "127.0.0.1:1", "--tokens", "1",
                                 "--policy", "nope"])
    assert result.exit_code == 2
    assert all(name in result.output for name in POLICIES)


def test_route_shows_each_candidates_peer_fetch_and_takes_a_worker_id(cluster) -> None:
    plan = index_pb2.FetchPlan(source_worker_id="h1", source_address="127.0.0.1:7",
                               start_block=1, block_hashes=[b"\x01" * 32, b"\x02" * 32],
                               tokens=32, est_s=0.0042, ticket=b"\xab\xcd")
    fetching = candidate("w2", "127.0.0.1:2", 48)
    fetching.fetch.CopyFrom(plan)
    index = FakeIndex([fetching, candidate("h1", "127.0.0.1:7", 48)])
    address = cluster.index(index)
    result = runner.invoke(app, ["route", "--service", address, "--tokens", "1,2",
                                 "--worker-id", "w2"], env=WIDE)
    assert result.exit_code == 0, result.output
    assert index.routes[-1].worker_id == "w2" and index.routes[-1].dry_run
    rows = {line.split("│")[2].strip(): line.split("│")[-2].strip()
            for line in result.stdout.splitlines() if line.count("│") > 9}
    assert rows["w2"] == "2 blk (32 tok) from h1, ~4.2 ms" and rows["h1"] == "-"
    assert "48/2 prompt tokens cached, 32 pulled from h1 first" in result.stdout
    result = runner.invoke(app, ["route", "--service", address, "--tokens", "1", "--json"])
    assert result.exit_code == 0, result.output
    fetch = json.loads(result.stdout)["candidates"][0]["fetch"]
    assert fetch["source_worker_id"] == "h1" and fetch["ticket"] == "abcd"
    assert fetch["block_hashes"] == ["01" * 32, "02" * 32] and fetch["start_block"] == 1
    assert json.loads(result.stdout)["candidates"][1]["fetch"] is None


def test_generate_takes_a_worker_id(service) -> None:
    result = runner.invoke(app, ["generate", "--service", service.address, "--tokens", "1,2",
                                 "--worker-id", "w1", "--json"])
    assert result.exit_code == 0, result.output
    assert service.routes[-1].worker_id == "w1"


def test_stats_shows_peer_fetches_per_worker_zeros_when_unreported(service) -> None:
    w1 = service.workers[0]
    w1.peer = None  # a worker that predates peer fetch: no PeerStats at all
    result = runner.invoke(app, ["stats", "--service", service.address], env=WIDE)
    assert result.exit_code == 0, result.output
    assert "peer in/out" in result.stdout and "Peer KV transfer" in result.stdout
    rows = [line for line in result.stdout.splitlines() if line.count("│") > 9]
    assert any("w1" in r and "0/0" in r for r in rows), result.stdout
    from kvmesh.v1 import worker_pb2

    w1.peer = worker_pb2.PeerStats(fetches=3, fetched_blocks=12, fetched_bytes=3 << 20,
                                   served=5, refused=1, peer_hit_tokens=192)
    result = runner.invoke(app, ["stats", "--service", service.address], env=WIDE)
    assert "3/5" in result.stdout
    peer_row = [line for line in result.stdout.splitlines()
                if line.count("│") == 11 and "w1" in line and "MiB" in line]
    assert [c.strip() for c in peer_row[0].split("│")[1:-1]] == [
        "w1", "3", "12", "3.0 MiB", "0", "192", "5", "0", "0.0 MiB", "1"]
    narrow = runner.invoke(app, ["stats", "--service", service.address],
                           env={"COLUMNS": "80"})
    assert "…" not in narrow.stdout and "refused" in narrow.stdout


def test_stats_tenants_sums_the_workers_rows(service) -> None:
    from kvmesh.v1 import worker_pb2

    w1, w2 = service.workers
    w1.tenants = [worker_pb2.TenantStats(
        tenant="acme", requests=4, prompt_tokens=640, cached_tokens=480,
        tiers=[worker_pb2.TenantTier(tier="gpu", blocks=12, quota_blocks=40,
                                     evicted_blocks=3)])]
    result = runner.invoke(app, ["stats", "--service", service.address, "--tenants",
                                 "--json"])
    assert result.exit_code == 0, result.output
    (acme,) = json.loads(result.stdout)["tenants"]  # w2 is down: only w1's rows
    assert (acme["tenant"], acme["requests"], acme["cached_tokens"]) == ("acme", 4, 480)
    assert acme["tiers"]["gpu"]["quota_blocks"] == 40
    table = runner.invoke(app, ["stats", "--service", service.address, "--tenants"],
                          env=WIDE)
    row = next(line for line in table.stdout.splitlines() if "acme" in line)
    assert [c.strip() for c in row.split("│")[1:-1]] == [
        "acme", "4", "640", "75.0%", "12 / 40", "-", "-", "3"]
    plain = runner.invoke(app, ["stats", "--service", service.address], env=WIDE)
    assert "acme" not in plain.stdout  # the tenants table only with --tenants
