"""A kvmesh worker: prefix-cached KV pool, paged-attention model, continuous batching."""


def __getattr__(name: str):
    # Lazy so `import worker.kv_cache` (and the CLI) does not pay for importing torch.
    if name in ("Engine", "Completion", "RequestError"):
        from worker.engine import engine
        return getattr(engine, name)
    if name == "SamplingParams":
        from worker.engine.sequence import SamplingParams

        return SamplingParams
    raise AttributeError(f"module 'worker' has no attribute {name!r}")
