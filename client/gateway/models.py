"""The models a gateway serves: ``GET /v1/models`` and ``GET /v1/models/{id}``.

The base model (``--served-model-name``) and each LoRA adapter of ``--lora NAME=PATH``, as
vLLM lists them: OpenAI's model object (``id``, ``object``, ``created``, ``owned_by``) plus
vLLM's ``root``, ``parent`` (the base model's name, for an adapter) and ``max_model_len``
(the gateway's ``--max-model-len``). ``root`` is the served name, never a path on the
gateway's host. ``GET /v1/models/{id}`` (the ``openai`` SDK's ``models.retrieve``) answers
one of them, or 404 ``model_not_found``; ids may contain ``/`` (``org/model``). Both need
the caller's API key when the gateway has tenant keys, as every ``/v1`` route does.
"""
from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from fastapi import Depends, FastAPI

from kvmesh.openai.errors import OpenAIError


class ModelCards:
    """The model objects of one gateway (``loras``: adapter name -> path)."""

    def __init__(self, model: str, loras: Mapping[str, str], max_model_len: int,
                 created: int) -> None:
        base = self._card(model, None, max_model_len, created)
        self._cards = {model: base}
        for name in loras:
            self._cards.setdefault(name, self._card(name, model, max_model_len, created))

    @staticmethod
    def _card(name: str, parent: str | None, max_model_len: int,
              created: int) -> dict[str, Any]:
        return {"id": name, "object": "model", "created": created, "owned_by": "kvmesh",
                "root": name, "parent": parent, "max_model_len": max_model_len}

    def listing(self) -> dict[str, Any]:
        """``GET /v1/models``: the base model first, then the adapters."""
        return {"object": "list", "data": list(self._cards.values())}

    def card(self, model_id: str) -> dict[str, Any]:
        """One model object; raises a 404 ``OpenAIError`` for a model not served here."""
        card = self._cards.get(model_id)
        if card is None:
            raise OpenAIError(404, f"The model `{model_id}` does not exist; this gateway serves "
                              f"{', '.join(f'`{m}`' for m in self._cards)}", param="model",
                              code="model_not_found")
        return card


def install_model_routes(app: FastAPI, cards: ModelCards,
                         authenticate: Callable[..., Any]) -> None:
    """The two model routes on ``app``; ``authenticate`` is the API-key dependency."""

    @app.get("/v1/models", dependencies=[Depends(authenticate)])
    async def listing() -> dict[str, Any]:
        return cards.listing()

    @app.get("/v1/models/{model_id:path}", dependencies=[Depends(authenticate)])
    async def retrieve(model_id: str) -> dict[str, Any]:
        return cards.card(model_id)
