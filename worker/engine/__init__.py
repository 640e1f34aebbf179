"""The engine: one model, one prefix-caching KV pool, continuous batching (``engine.py``),
driven from asyncio (``async_engine.py``); scheduler, sequences, sampler and measured costs.

``Engine``, ``Completion`` and ``RequestError`` are importable from here, lazily, so that the
torch-free parts (``costs``, ``sequence``) do not pull in torch.
"""


def __getattr__(name: str):
    if name in ("Engine", "Completion", "RequestError", "StepFailed"):
        from worker.engine import engine

        return getattr(engine, name)
    raise AttributeError(f"module 'worker.engine' has no attribute {name!r}")
