"""kvmesh.openai."""
