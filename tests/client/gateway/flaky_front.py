"""An HTTP engine's front door for tests: relays every request to the engine behind it, or
answers 500 to generation requests while ``failing`` (an engine whose step fails)."""
from __future__ import annotations

import socket
import threading

import httpx2
import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from deploy.waiting import wait_until


class FlakyFront:
    def __init__(self, target: str) -> None:
        self.target = target
        self.failing = False
        self.refused = 0  # generation requests answered 500
        self.relayed = 0
        sock = socket.socket()
        sock.bind(("127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{sock.getsockname()[1]}"
        app = Starlette(routes=[Route("/{path:path}", self._relay, methods=["GET", "POST"])])
        self.server = uvicorn.Server(uvicorn.Config(app, log_level="warning"))
        self.thread = threading.Thread(target=self.server.run, kwargs={"sockets": [sock]},
                                       daemon=True)
        self.thread.start()
        wait_until(lambda: self.server.started, 10, what="front start")

    async def _relay(self, request: Request) -> Response:
        if request.method == "POST" and self.failing:
            self.refused += 1
            return JSONResponse({"error": {"message": "engine step failed"}}, status_code=500)
        async with httpx2.AsyncClient(trust_env=False, timeout=60) as client:
            resp = await client.request(request.method, self.target + request.url.path,
                                        content=await request.body(),
                                        headers={"content-type": "application/json"})
        self.relayed += request.method == "POST"
        return Response(resp.content, status_code=resp.status_code,
                        media_type=resp.headers.get("content-type"))

    def stop(self) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=10)
