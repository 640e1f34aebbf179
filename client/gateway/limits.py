"""The gateway's per-request limits and their defaults (no heavy imports: the CLI reads them).

Every limit is checked before a request is routed, so a refused request writes nothing to
the index and reaches no worker:

- ``max_body_bytes``: request body size, checked before it is read (413);
- ``max_batch_prompts``: prompts in one completions request (400);
- ``max_model_len``: prompt tokens + ``max_tokens`` (400; default the model's context);
- ``max_concurrent``: prompts one tenant may have generating at once (429, ``Retry-After``).
"""
from __future__ import annotations

DEFAULT_MAX_BODY_BYTES = 4 * 1024 * 1024
DEFAULT_MAX_BATCH = 16
DEFAULT_MAX_CONCURRENT = 32
RETRY_AFTER_S = 1
