"""An in-test stand-in for a vLLM API server's Prometheus ``/metrics`` page, over real HTTP.

The page is built as vLLM writes it: gauges labelled ``model_name`` and ``engine`` (one sample
per data-parallel rank), ``vllm:cache_config_info`` with ``block_size`` / ``num_gpu_blocks``
labels, the ``vllm:request_prompt_tokens`` histogram. ``fail = True`` answers 503 (an engine
whose metrics stop answering); ``stop()`` closes the port (connection refused).
"""
from __future__ import annotations

import threading
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


@dataclass
class RankLoad:
    running: int = 0
    waiting: int = 0
    usage: float = 0.0  # vllm:kv_cache_usage_perc
    prompts: int = 0    # requests finished (the prompt histogram's count)
    prompt_tokens: int = 0


class FakeMetrics:
    def __init__(self, model: str = "fake-vllm", ranks: int = 1, num_blocks: int = 1000,
                 block_size: int = 16) -> None:
        self.model = model
        self.num_blocks = num_blocks
        self.block_size = block_size
        self.load = [RankLoad() for _ in range(ranks)]
        self.fail = False
        self.requests = 0
        owner = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:  # noqa: N802 - http.server's name
                owner.requests += 1
                body = b"" if owner.fail else owner.page().encode()
                self.send_response(503 if owner.fail or self.path != "/metrics" else 200)
                self.send_header("Content-Type", "text/plain; version=0.0.4")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args: object) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    @property
    def url(self) -> str:
        """The engine's address (its metrics are at ``{url}/metrics``)."""
        return f"http://127.0.0.1:{self.server.server_address[1]}"

    def page(self) -> str:
        lines = []

        def family(name: str, kind: str, samples: list[tuple[str, float]]) -> None:
            lines.append(f"# HELP {name} {name}.")
            lines.append(f"# TYPE {name} {kind}")
            lines.extend(f"{name}{suffix} {value}" for suffix, value in samples)

        labels = [f'{{engine="{r}",model_name="{self.model}"}}' for r in range(len(self.load))]
        family("vllm:num_requests_running", "gauge",
               [(lb, ld.running) for lb, ld in zip(labels, self.load, strict=True)])
        family("vllm:num_requests_waiting", "gauge",
               [(lb, ld.waiting) for lb, ld in zip(labels, self.load, strict=True)])
        family("vllm:kv_cache_usage_perc", "gauge",
               [(lb, ld.usage) for lb, ld in zip(labels, self.load, strict=True)])
        family("vllm:cache_config_info", "gauge", [
            (f'{{block_size="{self.block_size}",cache_dtype="auto",engine="{r}",'
             f'num_cpu_blocks="None",num_gpu_blocks="{self.num_blocks}"}}', 1.0)
            for r in range(len(self.load))])
        lines.append("# TYPE vllm:request_prompt_tokens histogram")
        for lb, ld in zip(labels, self.load, strict=True):
            inner = lb[1:-1]
            lines.append(f'vllm:request_prompt_tokens_bucket{{{inner},le="+Inf"}} {ld.prompts}')
            lines.append(f"vllm:request_prompt_tokens_count{lb} {ld.prompts}")
            lines.append(f"vllm:request_prompt_tokens_sum{lb} {ld.prompt_tokens}")
        return "\n".join(lines) + "\n"

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()
