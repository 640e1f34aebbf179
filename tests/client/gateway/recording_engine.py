"""An HTTP engine for gateway tests: a real loopback server that records every request
(path, headers, JSON body) and answers as vLLM does, reporting ``cached`` prompt tokens in
``usage.prompt_tokens_details`` (whole answers, and streams whose every chunk carries usage,
as vLLM's ``continuous_usage_stats``, split over many small writes)."""
from __future__ import annotations

import http.server
import json
import threading
from typing import Any


class RecordingEngine:
    def __init__(self, cached: int = 7, status: int = 200) -> None:
        self.cached = cached
        self.status = status
        self.requests: list[dict[str, Any]] = []
        engine = self

        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def do_POST(self) -> None:  # noqa: N802
                body = json.loads(self.rfile.read(int(self.headers.get("content-length", 0))))
                engine.requests.append({"path": self.path, "body": body,
                                        "headers": {k.lower(): v for k, v in
                                                    self.headers.items()}})
                if engine.status != 200:
                    self._send(engine.status, b'{"error": {"message": "engine failed"}}')
                elif body.get("stream"):
                    self._stream(body)
                else:
                    self._send(200, json.dumps(engine.answer(body)).encode())

            def _send(self, status: int, out: bytes) -> None:
                self.send_response(status)
                self.send_header("content-type", "application/json")
                self.send_header("content-length", str(len(out)))
                self.end_headers()
                self.wfile.write(out)

            def _stream(self, body: dict[str, Any]) -> None:
                self.send_response(200)
                self.send_header("content-type", "text/event-stream")
                self.send_header("connection", "close")
                self.end_headers()
                for i, text in enumerate(("he", "llo")):
                    chunk = {**engine.answer(body), "object": "text_completion",
                             "choices": [{"index": 0, "text": text,
                                          "finish_reason": "length" if i else None}]}
                    event = b"data: " + json.dumps(chunk).encode() + b"\n\n"
                    for k in range(0, len(event), 9):  # cut anywhere, even in "\n\n"
                        self.wfile.write(event[k:k + 9])
                        self.wfile.flush()
                self.wfile.write(b"data: [DONE]\n\n")
                self.close_connection = True

            def log_message(self, *args: Any) -> None:
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def answer(self, body: dict[str, Any]) -> dict[str, Any]:
        return {"id": "cmpl-1", "object": "text_completion", "model": body.get("model"),
                "choices": [{"index": 0, "text": "hello", "finish_reason": "length"}],
                "usage": {"prompt_tokens": 10, "completion_tokens": 2, "total_tokens": 12,
                          "prompt_tokens_details": {"cached_tokens": self.cached}}}

    @property
    def keys(self) -> list[str | None]:
        """The ``authorization`` header of every request received, in order."""
        return [r["headers"].get("authorization") for r in self.requests]

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()
