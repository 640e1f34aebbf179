"""One prompt through kvmesh: route, generate on the chosen worker, detokenize.

``generate_text`` waits for the whole generation (the client fails over between candidate
workers even mid-generation); ``start_stream`` waits only for the first tokens, so a request
that cannot be served at all still fails with a proper HTTP status, and then yields text
deltas as the worker produces them (each with the completion tokens so far, for vLLM's
``continuous_usage_stats``). Stop strings end a stream early and cancel the worker's
request.
"""
from __future__ import annotations

from collections.abc import AsyncGenerator
from dataclasses import dataclass, field
from typing import NamedTuple

from client.async_client import AsyncKvmeshClient, TokenChunk
from client.gateway.textstream import TextStream
from client.gateway.tokenizer import Tokenizer
from client.results import GenerateResult, RouteResult
from kvmesh.openai.responses import Usage


@dataclass(frozen=True)
class Job:
    """What to generate: prompt ids, the salt already decided, and sampling.

    ``report_cached`` False: the caller is told 0 cached tokens, whatever the worker served
    (its salt is shared with callers it did not choose; see ``client.gateway.tenants``).
    """

    token_ids: list[int]
    salt: str | None
    max_tokens: int
    temperature: float
    seed: int | None = None
    stop: list[str] = field(default_factory=list)
    report_cached: bool = True
    lora: tuple[str, str] | None = None  # (name, path) of the adapter the model names
    routed: RouteResult | None = None    # already routed (these ids, salt and LoRA)
    tenant: str | None = None            # the API key's tenant (quotas); None: the default
    ignore_eos: bool = False             # vLLM's extra field: generate max_tokens whatever


@dataclass(frozen=True)
class Outcome:
    """A finished choice: its text, OpenAI finish reason, usage and the serving worker.

    ``hidden_cached``: the cached prompt tokens the worker served that ``usage`` does not
    report (``Job.report_cached`` False), for the operator's metrics only.
    """

    text: str
    finish_reason: str
    usage: Usage
    worker_id: str
    ttft_s: float | None = None  # the worker's time to first token; None: not measured
    hidden_cached: int = 0


class Delta(NamedTuple):
    """Text a stream may emit now, and the completion tokens generated so far."""

    text: str
    completion_tokens: int


def _finish_reason(result: GenerateResult) -> str:
    return result.finish_reason if result.finish_reason in ("stop", "length") else "length"


def _outcome(job: Job, text: str, stream: TextStream, result: GenerateResult) -> Outcome:
    completion = stream.num_tokens if stream.stopped else len(result.token_ids)
    # a caller without the salt learns nothing of the cache, not even by tier
    cached = result.num_cached_tokens if job.report_cached else 0
    by_tier = (result.cached_tokens_by_tier or None) if job.report_cached else {}
    usage = Usage(result.prompt_tokens or len(job.token_ids), completion, cached, by_tier)
    hidden = 0 if job.report_cached else result.num_cached_tokens
    return Outcome(text, "stop" if stream.stopped else _finish_reason(result), usage,
                   result.worker_id, result.ttft_s, hidden)


async def generate_text(client: AsyncKvmeshClient, tokenizer: Tokenizer, job: Job) -> Outcome:
    """Generate ``job`` to the end and detokenize it. Raises ``KvmeshError``."""
    result = await client.generate(job.token_ids, max_tokens=job.max_tokens, salt=job.salt,
                                   temperature=job.temperature, seed=job.seed, lora=job.lora,
                                   routed=job.routed, tenant=job.tenant,
                                   ignore_eos=job.ignore_eos)
    stream = TextStream(tokenizer, job.stop)
    text = stream.push(result.token_ids)
    text += stream.finish()
    return _outcome(job, text, stream, result)


@dataclass
class TextDeltas:
    """A started stream: the worker serving it and an iterator of ``Delta`` that ends with
    one ``Outcome`` (its ``text`` empty: the deltas are the text)."""

    worker_id: str
    events: AsyncGenerator[Delta | Outcome, None]


async def start_stream(client: AsyncKvmeshClient, tokenizer: Tokenizer, job: Job) -> TextDeltas:
    """Route and start generating; returns once the first tokens (or the whole result)
    arrived. Raises ``KvmeshError`` when no worker could start the request."""
    chunks = client.generate_stream(job.token_ids, max_tokens=job.max_tokens, salt=job.salt,
                                    temperature=job.temperature, seed=job.seed, lora=job.lora,
                                    routed=job.routed, tenant=job.tenant,
                                    ignore_eos=job.ignore_eos)
    try:
        first = await anext(chunks)
    except BaseException:
        await chunks.aclose()
        raise
    return TextDeltas(first.worker_id, _deltas(job, tokenizer, first, chunks))


async def _deltas(job: Job, tokenizer: Tokenizer, first: TokenChunk | GenerateResult,
                  chunks: AsyncGenerator[TokenChunk | GenerateResult, None],
                  ) -> AsyncGenerator[Delta | Outcome, None]:
    stream = TextStream(tokenizer, job.stop)
    item = first
    try:
        while True:
            if isinstance(item, GenerateResult):
                tail = stream.finish()
                if tail:
                    yield Delta(tail, stream.num_tokens)
                yield _outcome(job, "", stream, item)
                return
            text = stream.push(item.token_ids)
            if text:
                yield Delta(text, stream.num_tokens)
            if stream.stopped:
                usage = Usage(len(job.token_ids), stream.num_tokens, None)
                yield Outcome("", "stop", usage, item.worker_id)
                return
            item = await anext(chunks)
    finally:
        await chunks.aclose()
