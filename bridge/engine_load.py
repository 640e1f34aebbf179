"""An engine's load, read from vLLM's Prometheus ``/metrics`` (the cost model's inputs).

``parse_load`` reads one data-parallel rank's samples (running, waiting, blocks, estimated
decode and queued prefill); without the rank's ``vllm:num_requests_running`` the engine did
not answer (``None``). Ranks sharing an API server share one scrape per heartbeat.

See docs/architecture.md#bridge-configuration-and-load.
"""
from __future__ import annotations

import asyncio
import http.client
import logging
import math
import time
import urllib.request
from collections import defaultdict
from dataclasses import dataclass

from prometheus_client.parser import text_string_to_metric_families

from kvmesh.v1 import index_pb2

log = logging.getLogger("kvmesh.bridge.load")

RUNNING = "vllm:num_requests_running"
WAITING = "vllm:num_requests_waiting"
USAGE = ("vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc")
CACHE_INFO = "vllm:cache_config_info"
PROMPT_SUM, PROMPT_COUNT = "vllm:request_prompt_tokens_sum", "vllm:request_prompt_tokens_count"
# Only these lines are parsed: vLLM's page has hundreds of histogram buckets per engine.
_WANTED = (RUNNING, WAITING, *USAGE, CACHE_INFO, PROMPT_SUM, PROMPT_COUNT)
MAX_PAGE = 16 * 1024 * 1024
UINT32_MAX = 2**32 - 1


@dataclass(frozen=True)
class EngineLoad:
    running: int = 0
    waiting: int = 0
    free_blocks: int = 0
    total_blocks: int = 0
    decode_tokens: int = 0
    queued_prefill_tokens: int = 0
    model: str | None = None       # the ``model_name`` label: the served model's name
    block_size: int | None = None  # the ``block_size`` label of ``vllm:cache_config_info``

    def proto(self) -> index_pb2.WorkerLoad:
        return index_pb2.WorkerLoad(
            running=self.running, waiting=self.waiting, free_blocks=self.free_blocks,
            total_blocks=self.total_blocks, decode_tokens=self.decode_tokens,
            queued_prefill_tokens=self.queued_prefill_tokens)


def _samples(text: str) -> dict[str, list[tuple[dict[str, str], float]]]:
    lines = [ln for ln in text.splitlines() if ln.startswith(_WANTED)]
    out: dict[str, list[tuple[dict[str, str], float]]] = defaultdict(list)
    for family in text_string_to_metric_families("\n".join(lines) + "\n"):
        for s in family.samples:
            out[s.name].append((s.labels, s.value))
    return out


def _of_rank(samples: list[tuple[dict[str, str], float]], rank: int
             ) -> list[tuple[dict[str, str], float]]:
    return [(lb, v) for lb, v in samples if lb.get("engine", str(rank)) == str(rank)]


def _sum(samples: list[tuple[dict[str, str], float]]) -> float | None:
    vals = [v for _, v in samples if math.isfinite(v)]
    return sum(vals) if vals else None


def _count(value: float | None, top: int = UINT32_MAX) -> int:
    """A figure as a ``WorkerLoad`` count: 0 unless finite, clamped to ``[0, top]`` (a page
    may say anything; the service refuses what its fields cannot hold)."""
    if value is None or not math.isfinite(value):
        return 0
    return min(max(0, int(value)), top)


def _int_label(samples: list[tuple[dict[str, str], float]], name: str) -> int | None:
    for labels, _ in samples:
        try:
            return int(labels[name])
        except (KeyError, ValueError):
            continue
    return None


def parse_load(text: str, rank: int = 0, *, num_blocks: int | None = None,
               block_size: int = 16) -> EngineLoad | None:
    """Rank ``rank``'s load from a ``/metrics`` page; ``None`` when the page has no
    ``vllm:num_requests_running`` sample for it. Raises ``ValueError`` for a page that does
    not parse."""
    by_name = _samples(text)
    running = _of_rank(by_name.get(RUNNING, []), rank)
    if not running:
        return None
    waiting = _count(_sum(_of_rank(by_name.get(WAITING, []), rank)))
    info = _of_rank(by_name.get(CACHE_INFO, []), rank)
    total = _count(_int_label(info, "num_gpu_blocks") or num_blocks)
    usage = next((u for name in USAGE
                  if (u := _sum(_of_rank(by_name.get(name, []), rank))) is not None), None)
    used = min(total, max(0, math.ceil(total * usage))) if usage is not None else 0
    count = _sum(_of_rank(by_name.get(PROMPT_COUNT, []), rank)) or 0
    mean_prompt = (_sum(_of_rank(by_name.get(PROMPT_SUM, []), rank)) or 0) / count if count else 0
    return EngineLoad(
        running=_count(_sum(running)), waiting=waiting, free_blocks=total - used,
        total_blocks=total, decode_tokens=used * block_size,
        queued_prefill_tokens=_count(waiting * mean_prompt, 2**64 - 1),
        model=next((lb["model_name"] for lb, _ in running if lb.get("model_name")), None),
        block_size=_int_label(info, "block_size"))


class Scraper:
    """One ``/metrics`` URL, fetched at most once per ``max_age`` whoever asks (the ranks of
    one API server share it). A fetch runs in a thread (``urllib``, proxies ignored: metrics
    endpoints are internal) and fails after ``timeout`` seconds."""

    def __init__(self, url: str, timeout: float = 1.0) -> None:
        self.url = url
        self.timeout = timeout
        self.fetches = 0
        self.failures = 0
        self._opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
        self._page: tuple[float, str | None] | None = None
        self._lock = asyncio.Lock()

    async def page(self, max_age: float) -> str | None:
        """The page, fetched within ``max_age`` seconds; ``None`` if that fetch failed."""
        async with self._lock:
            if self._page is None or time.monotonic() - self._page[0] > max_age:
                self._page = (time.monotonic(), await self._fetch())
            return self._page[1]

    async def _fetch(self) -> str | None:
        self.fetches += 1
        try:
            return await asyncio.to_thread(self._get)
        except (OSError, ValueError, http.client.HTTPException):  # refused, timed out,
            # an HTTP error status, a broken response, not text
            self.failures += 1
            return None

    def _get(self) -> str:
        with self._opener.open(self.url, timeout=self.timeout) as resp:
            body = resp.read(MAX_PAGE + 1)
        if len(body) > MAX_PAGE:
            raise ValueError(f"{self.url}: metrics page over {MAX_PAGE} bytes")
        return body.decode()


class LoadSource:
    """One rank's load from a shared ``Scraper``; ``None`` while its metrics are silent."""

    def __init__(self, scraper: Scraper, rank: int = 0, *, num_blocks: int | None = None,
                 block_size: int = 16) -> None:
        self.scraper = scraper
        self.rank = rank
        self.num_blocks = num_blocks
        self.block_size = block_size
        self.last: EngineLoad | None = None
        self.bad_page = False

    async def sample(self, max_age: float) -> EngineLoad | None:
        page = await self.scraper.page(max_age)
        try:
            load = None if page is None else parse_load(
                page, self.rank, num_blocks=self.num_blocks, block_size=self.block_size)
        except Exception as e:  # noqa: BLE001 - a page is outside input: it can be anything
            if not self.bad_page:
                log.warning("%s: unreadable metrics page (%s): no heartbeat until it reads",
                            self.scraper.url, e)
            self.bad_page = True
            load = None
        else:
            self.bad_page = False
        self.last = load
        return load
