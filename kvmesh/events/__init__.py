"""kvmesh.events."""
