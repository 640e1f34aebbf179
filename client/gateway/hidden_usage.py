"""Zero an HTTP engine's cached-token counts in its answer, whole or streamed.

A request whose cache hits may not be reported (``Salting.report_cached`` False: an unsalted
request under ``--insecure-shared-cache``) is told 0 cached tokens, whoever serves it. kvmesh
workers' counts are zeroed where the gateway builds the answer (``client.gateway.generation``);
an HTTP engine's answer is relayed, so its ``usage`` is rewritten on the way:
``usage.prompt_tokens_details.cached_tokens`` becomes 0 (and every count of kvmesh's
``cached_tokens_by_tier`` too), in a JSON body and in every server-sent event that carries
``usage`` (``stream_options.include_usage``; vLLM's ``continuous_usage_stats`` puts it in
every chunk). Nothing else changes: an event without ``usage`` passes byte for byte, as it
arrived, and is never held back longer than it takes its end (a blank line) to arrive.
"""
from __future__ import annotations

import json
import re
from collections.abc import AsyncIterator
from typing import Any

_EVENT_END = re.compile(rb"\r\n\r\n|\n\n|\r\r")
_LINE = re.compile(rb"(\r\n|\n|\r)")


def _zero(usage: Any) -> bool:
    """Zero the cached counts of one ``usage`` object in place; whether it had any."""
    details = usage.get("prompt_tokens_details") if isinstance(usage, dict) else None
    if not isinstance(details, dict):
        return False
    if "cached_tokens" in details:
        details["cached_tokens"] = 0
    by_tier = details.get("cached_tokens_by_tier")
    if isinstance(by_tier, dict):
        details["cached_tokens_by_tier"] = {tier: 0 for tier in by_tier}
    return True


def _hide(obj: Any) -> bool:
    """Zero the counts of ``obj``'s ``usage`` (and of its choices', where engines put one)."""
    if not isinstance(obj, dict):
        return False
    changed = _zero(obj.get("usage"))
    for choice in obj.get("choices") or ():
        if isinstance(choice, dict):
            changed |= _zero(choice.get("usage"))
    return changed


def hide_in_body(body: bytes) -> bytes:
    """A JSON answer with its cached counts zeroed; anything else (not JSON, no usage)
    unchanged."""
    if b"usage" not in body:
        return body
    try:
        obj = json.loads(body)
    except ValueError:
        return body
    return json.dumps(obj).encode() if _hide(obj) else body


def _hide_in_event(event: bytes) -> bytes:
    if b"usage" not in event:
        return event
    out = []
    for line in _LINE.split(event):
        if line.startswith(b"data:"):
            payload = line[5:].lstrip(b" ")
            try:
                obj = json.loads(payload)
            except ValueError:
                obj = None
            if _hide(obj):
                line = b"data: " + json.dumps(obj).encode()
        out.append(line)
    return b"".join(out)


async def hide_in_stream(chunks: AsyncIterator[bytes]) -> AsyncIterator[bytes]:
    """``chunks`` of server-sent events with each event's cached counts zeroed: complete
    events are passed on as soon as they end; a last unterminated event at the end of the
    stream is rewritten too (it reaches the caller as it would have)."""
    pending = b""
    try:
        async for chunk in chunks:
            pending += chunk
            cut = 0
            for end in _EVENT_END.finditer(pending):
                yield _hide_in_event(pending[cut:end.start()]) + end.group()
                cut = end.end()
            pending = pending[cut:]
        if pending:
            yield _hide_in_event(pending)
    finally:
        aclose = getattr(chunks, "aclose", None)
        if aclose is not None:
            await aclose()
