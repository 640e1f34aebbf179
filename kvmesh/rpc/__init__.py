"""kvmesh.rpc."""
