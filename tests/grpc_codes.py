"""The status a grpc.aio call ends with, for tests that expect refusals."""
from __future__ import annotations

import grpc


async def status_of(call: object) -> tuple[grpc.StatusCode, str]:
    """``(code, details)`` of ``call``: a unary call is awaited, a stream read to its end;
    ``(OK, "")`` when it succeeds."""
    try:
        if hasattr(call, "__aiter__"):
            async for _ in call:
                pass
        else:
            await call  # type: ignore[misc]
    except grpc.aio.AioRpcError as e:
        return e.code(), e.details() or ""
    return grpc.StatusCode.OK, ""


async def code_of(call: object) -> grpc.StatusCode:
    """The code of ``call`` (see :func:`status_of`); every refusal must say why."""
    code, details = await status_of(call)
    assert code == grpc.StatusCode.OK or details, "every refusal says why"
    return code
