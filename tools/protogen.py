"""Regenerate the committed gRPC stubs in kvmesh/v1/ from proto/kvmesh/v1/*.proto.

`python -m tools.protogen [OUT_DIR]` (default: the repository root, i.e. in place; `make
proto`). A development tool: it lives outside the installed packages. The
stubs are committed so users need no grpcio-tools; tests regenerate into a temporary
directory and compare bytes, so the two can never drift apart.
"""
from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PROTO_DIR = ROOT / "proto"
PROTOS = ("kvmesh/v1/index.proto", "kvmesh/v1/worker.proto")


def generate(out_dir: Path) -> list[Path]:
    """Run protoc (grpcio-tools) for every proto; return the files written."""
    import grpc_tools
    from grpc_tools import protoc

    include = str(Path(grpc_tools.__file__).parent / "_proto")
    out_dir.mkdir(parents=True, exist_ok=True)
    for proto in PROTOS:
        rc = protoc.main(["protoc", f"-I{PROTO_DIR}", f"-I{include}",
                          f"--python_out={out_dir}", f"--pyi_out={out_dir}",
                          f"--grpc_python_out={out_dir}", proto])
        if rc != 0:
            raise RuntimeError(f"protoc failed on {proto} (exit {rc})")
    return sorted((out_dir / "kvmesh" / "v1").glob("*_pb2*.py*"))


if __name__ == "__main__":
    generate(Path(sys.argv[1]) if len(sys.argv) > 1 else ROOT)
