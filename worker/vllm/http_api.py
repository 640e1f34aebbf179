"""``kvmesh worker --http-port``: the engine behind an OpenAI-compatible HTTP server, as vLLM's.

Completions, chat completions (with a chat template), models and health, with vLLM's rules
and error body. The vLLM metrics page is never served here (prefix-cache hits are every
caller's). A stream starts only once the first tokens exist, so a failure before them is an
HTTP status; after them, a last ``data: {"error": ...}`` event.

See docs/architecture.md#worker-vllm-face.
"""
from __future__ import annotations

import asyncio
import contextlib
import hmac
import uuid
from collections.abc import AsyncIterator, Mapping
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse

from kvmesh.hashing import Lora
from kvmesh.openai.errors import OpenAIError
from kvmesh.openai.requests import (
    Body,
    ChatCompletionRequest,
    CompletionRequest,
    OpenAIRequest,
    parse,
)
from kvmesh.openai.responses import DONE, ResponseShape, Usage, sse
from kvmesh.openai.tokenizer import ChatTemplateError, VllmTokenizer
from worker.engine.async_engine import AsyncEngine
from worker.engine.engine import RequestError, StepFailed, StepOutput
from worker.engine.sequence import SamplingParams, Seq
from worker.vllm.metrics import VllmMetrics

_STREAM_HEADERS = {"cache-control": "no-cache", "x-accel-buffering": "no"}


class _Text:
    """Incremental detokenization: text deltas that never cut a character."""

    def __init__(self, tokenizer: VllmTokenizer) -> None:
        self.tokenizer = tokenizer
        self.ids: list[int] = []
        self.sent = 0

    def push(self, ids: list[int], final: bool = False) -> str:
        self.ids.extend(ids)
        text = self.tokenizer.decode(self.ids)
        if not final and text.endswith("\ufffd"):
            return ""  # a character cut in the middle: wait for its other bytes
        delta, self.sent = text[self.sent:], len(text)
        return delta


class HttpApi:
    """The application's state; ``app`` is the ASGI application."""

    def __init__(self, runner: AsyncEngine, *, model_name: str, tokenizer: VllmTokenizer,
                 loras: Mapping[str, str] | None = None, access_token: str | None = None,
                 metrics: VllmMetrics | None = None) -> None:
        self.runner = runner
        self.model_name = model_name
        self.tokenizer = tokenizer
        self.loras = dict(loras or {})
        self.access_token = access_token
        self.metrics = metrics or VllmMetrics(runner, model_name)
        self.app = self._routes(FastAPI(title="kvmesh worker", docs_url=None, redoc_url=None))

    # --- requests --------------------------------------------------------------------

    def _auth(self, request: Request) -> None:
        if self.access_token is None:
            return
        given = request.headers.get("authorization", "")
        if not hmac.compare_digest(given.encode(), f"Bearer {self.access_token}".encode()):
            raise OpenAIError(401, "missing or wrong API key (Authorization: Bearer ...)")

    def _lora(self, model: str) -> Lora | None:
        if model == self.model_name:
            return None
        if model in self.loras:
            return (model, self.loras[model])
        raise OpenAIError(404, f"The model `{model}` does not exist.", param="model")

    def _ids(self, prompt: str | list[int], add_special_tokens: bool) -> list[int]:
        if isinstance(prompt, str):
            return self.tokenizer.encode(prompt, add_special_tokens)
        return list(prompt)

    def _room(self, ids: list[int]) -> int:
        """What the context leaves after the prompt ``ids`` (vLLM's chat default)."""
        engine = self.runner.engine
        pool = engine.kv.num_blocks * engine.kv.block_size
        room = min(engine.config.max_position_embeddings, pool) - len(ids)
        if room < 1:
            raise OpenAIError(400, f"the prompt has {len(ids)} tokens: nothing is left of the "
                              f"context of {room + len(ids)} to generate", param="messages")
        return room

    def _params(self, body: OpenAIRequest, max_tokens: int) -> SamplingParams:
        return SamplingParams(max_tokens=max_tokens, temperature=body.sampling_temperature(),
                              seed=body.seed, ignore_eos=body.ignore_eos)

    async def _start(self, ids: list[int], params: SamplingParams, salt: str | None,
                     lora: Lora | None) -> tuple[AsyncIterator[StepOutput], StepOutput]:
        """Start a generation; returns once its first output (tokens or the end) exists."""
        stream = self.runner.generate(ids, params, request_id=f"http-{uuid.uuid4().hex}",
                                      salt=salt, lora=lora)
        try:
            first = await anext(stream)
        except BaseException as exc:
            await stream.aclose()
            raise _http(exc) from None
        return stream, first

    async def _whole(self, ids: list[int], params: SamplingParams, salt: str | None,
                     lora: Lora | None) -> tuple[list[int], str, Usage]:
        stream, out = await self._start(ids, params, salt, lora)
        tokens = list(out.new_token_ids)
        try:
            while not out.finished:
                out = await anext(stream)
                tokens.extend(out.new_token_ids)
        except Exception as exc:
            raise _http(exc) from None
        finally:
            await stream.aclose()
        seq = out.seq
        self.metrics.finished(seq.num_prompt_tokens, len(tokens))
        return tokens, _finish(seq.finish_reason), _usage(len(ids), len(tokens), seq)

    def _body(self, kind: type[Body], raw: bytes) -> Body:
        """The request body, refused (400) for what the engine cannot honour."""
        body = parse(kind, raw)
        body.check_supported()
        if body.stop_strings():
            raise OpenAIError(400, "stop is not supported by this engine", param="stop",
                              code="unsupported")
        return body

    async def completions(self, request: Request) -> Response:
        self._auth(request)
        body = self._body(CompletionRequest, await request.body())
        lora = self._lora(body.model)
        prompts = [self._ids(p, body.add_special_tokens) for p in body.prompts()]
        params = self._params(body, body.max_new_tokens())
        shape = ResponseShape(False, body.model)
        if body.stream:
            if len(prompts) != 1:
                raise OpenAIError(400, "streaming takes a single prompt", param="prompt")
            return await self._stream(shape, prompts[0], params, body, lora)
        results = await asyncio.gather(*(self._whole(ids, params, body.cache_salt, lora)
                                         for ids in prompts))
        choices = [shape.choice(i, self.tokenizer.decode(toks), finish,
                                toks if body.return_token_ids else None)
                   for i, (toks, finish, _) in enumerate(results)]
        if body.return_token_ids:
            for choice, ids in zip(choices, prompts, strict=True):
                choice["prompt_token_ids"] = ids
        use = results[0][2]
        for _, _, more in results[1:]:
            use = use + more
        return JSONResponse(shape.body(choices, use))

    async def chat(self, request: Request) -> Response:
        self._auth(request)
        body = self._body(ChatCompletionRequest, await request.body())
        lora = self._lora(body.model)
        try:
            ids = self.tokenizer.chat_ids(body.message_dicts(), **body.template_options())
        except ChatTemplateError as exc:
            raise OpenAIError(400, str(exc), param="messages") from None
        params = self._params(body, body.requested_tokens() or self._room(ids))
        shape = ResponseShape(True, body.model)
        if body.stream:
            return await self._stream(shape, ids, params, body, lora)
        toks, finish, use = await self._whole(ids, params, body.cache_salt, lora)
        choice = shape.choice(0, self.tokenizer.decode(toks), finish,
                              toks if body.return_token_ids else None)
        return JSONResponse(shape.body([choice], use))

    async def _stream(self, shape: ResponseShape, ids: list[int], params: SamplingParams,
                      body: OpenAIRequest, lora: Lora | None) -> StreamingResponse:
        stream, first = await self._start(ids, params, body.cache_salt, lora)
        continuous = body.continuous_usage()

        async def events() -> AsyncIterator[str]:
            text, out, count = _Text(self.tokenizer), first, 0

            def so_far() -> Usage | None:  # vLLM's continuous_usage_stats
                return Usage(len(ids), count, None) if continuous else None

            try:
                if shape.chat:
                    yield sse(shape.chunk("", role=True, usage=so_far()))
                while True:
                    count += len(out.new_token_ids)
                    delta = text.push(out.new_token_ids, final=out.finished)
                    if delta:
                        yield sse(shape.chunk(delta, usage=so_far()))
                    if out.finished:
                        break
                    out = await anext(stream)
                seq = out.seq
                self.metrics.finished(seq.num_prompt_tokens, count)
                yield sse(shape.chunk(None if shape.chat else "", _finish(seq.finish_reason),
                                      usage=so_far()))
                if body.include_usage():
                    yield sse(shape.usage_chunk(_usage(len(ids), count, seq)))
            except (RequestError, StepFailed) as exc:
                err = _http(exc)
                assert isinstance(err, OpenAIError)
                yield sse(err.vllm_body())
            finally:
                await stream.aclose()
            yield DONE

        return StreamingResponse(events(), media_type="text/event-stream",
                                 headers=_STREAM_HEADERS)

    def models(self) -> dict[str, Any]:
        root = {"id": self.model_name, "object": "model", "owned_by": "kvmesh",
                "root": self.model_name, "parent": None}
        return {"object": "list", "data": [root, *(
            {"id": n, "object": "model", "owned_by": "kvmesh", "root": p,
             "parent": self.model_name} for n, p in self.loras.items())]}

    def _routes(self, app: FastAPI) -> FastAPI:
        @app.exception_handler(OpenAIError)
        async def _error(_: Request, exc: OpenAIError) -> JSONResponse:
            return JSONResponse(exc.vllm_body(), status_code=exc.status)

        app.post("/v1/completions", response_model=None)(self.completions)
        if self.tokenizer.chat is not None:
            app.post("/v1/chat/completions", response_model=None)(self.chat)

        @app.get("/v1/models")
        async def models(request: Request) -> dict[str, Any]:
            self._auth(request)
            return self.models()

        @app.get("/v1/models/{model_id:path}")
        async def model(model_id: str, request: Request) -> dict[str, Any]:
            self._auth(request)
            for card in self.models()["data"]:
                if card["id"] == model_id:
                    return card
            raise OpenAIError(404, f"The model `{model_id}` does not exist.", param="model")

        @app.get("/health")
        async def health() -> Response:
            return Response(status_code=500 if self.runner.error is not None else 200)

        return app


def _finish(reason: str | None) -> str:
    return reason if reason in ("stop", "length") else "length"


def _usage(prompt: int, completion: int, seq: Seq) -> Usage:
    """A finished request's usage: what the prefix cache served, by tier."""
    return Usage(prompt, completion, max(seq.num_cached_tokens, 0),
                 dict(seq.cached_tokens_by_tier) or None)


def _http(exc: BaseException) -> BaseException:
    if isinstance(exc, RequestError):
        return OpenAIError(400, str(exc), param="prompt")
    if isinstance(exc, StepFailed):
        return OpenAIError(500, str(exc))
    return exc


async def serve_http(api: HttpApi, host: str, port: int) -> tuple[Any, int, asyncio.Task]:
    """Serve ``api`` with uvicorn on the running loop; returns (server, bound port, task)
    once it listens."""
    import uvicorn

    config = uvicorn.Config(api.app, host=host, port=port, log_level="warning",
                            lifespan="off")
    server = uvicorn.Server(config)
    server.capture_signals = contextlib.nullcontext  # the worker owns SIGINT/SIGTERM
    task = asyncio.create_task(server.serve())
    while not server.started:
        if task.done():
            task.result()  # the port is taken: raise its error here
            raise RuntimeError("the HTTP server stopped before it listened")
        await asyncio.sleep(0.02)
    bound = server.servers[0].sockets[0].getsockname()[1]
    return server, bound, task
