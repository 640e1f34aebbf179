"""kvmesh.ops."""
