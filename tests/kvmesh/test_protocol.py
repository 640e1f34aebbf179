"""The committed gRPC stubs are exactly what proto/ generates (pinned grpcio-tools)."""
from pathlib import Path

from kvmesh.v1 import index_pb2, worker_pb2
from tools import protogen


def test_committed_stubs_match_proto(tmp_path):
    generated = protogen.generate(tmp_path)
    assert {p.name for p in generated} == {
        "index_pb2.py", "index_pb2.pyi", "index_pb2_grpc.py",
        "worker_pb2.py", "worker_pb2.pyi", "worker_pb2_grpc.py"}
    committed = Path(protogen.ROOT) / "kvmesh" / "v1"
    for path in generated:
        assert path.read_bytes() == (committed / path.name).read_bytes(), (
            f"kvmesh/v1/{path.name} is stale: run `make proto` and commit the result")


def test_services_have_the_contract_methods():
    index = index_pb2.DESCRIPTOR.services_by_name["IndexService"]
    assert {m.name for m in index.methods} == {
        "RegisterWorker", "Heartbeat", "PublishEvents", "SyncWorker", "Route", "Stats",
        "PinPrefix", "UnpinPrefix", "SetTenantQuota", "GetTenantQuotas"}
    worker = worker_pb2.DESCRIPTOR.services_by_name["WorkerService"]
    generate = worker.methods_by_name["Generate"]
    assert generate.server_streaming and not generate.client_streaming
    assert {"Generate", "Stats", "FetchBlocks", "Pin"} <= {m.name for m in worker.methods}


def test_token_ids_are_signed_so_negatives_can_be_refused():
    # uint fields would silently wrap a negative id; int64 lets the server say what is wrong.
    req = index_pb2.RouteRequest(token_ids=[-1, 5])
    assert list(index_pb2.RouteRequest.FromString(req.SerializeToString()).token_ids) == [-1, 5]
