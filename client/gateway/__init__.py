"""``kvmesh gateway``: an OpenAI-compatible HTTP gateway in front of a kvmesh cluster.

``/v1/completions``, ``/v1/chat/completions`` (streaming too), ``/v1/models``, ``/health``
(readiness), ``/ping`` (liveness) and ``/metrics`` (operator only);
requests are tokenized here, salted per tenant, routed by the kvmesh index to the worker that
holds most of their prefix, and answered with kvmesh's facts (cached prompt tokens, worker).
``create_app`` (in ``client.gateway.app``) builds the ASGI application; ``register`` adds the
command to the ``kvmesh`` CLI. Heavy imports (FastAPI, uvicorn, grpc) wait for the command.
"""
from __future__ import annotations

from client.gateway.cli import register

__all__ = ["register"]
