"""kvmesh.link."""
