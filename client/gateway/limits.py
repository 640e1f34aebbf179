"""The gateway's per-request limits and their defaults (no heavy imports: the CLI reads them).

Every limit is checked before a request is routed, so a refused request writes nothing to
the index and reaches no worker:

- ``max_body_bytes``: request body size, checked before it is read (413);
- ``max_batch_prompts``: prompts in one completions request (400);
- ``max_model_len``: prompt tokens + ``max_tokens`` (400; default the model's context);
- ``max_concurrent``: prompts one tenant may have generating (or waiting) at once (429,
  ``Retry-After``);
- ``max_total``: prompts the gateway admits at once, all tenants together (0: no bound);
  over it requests wait their weighted fair turn (``client.gateway.fair_slots``) for at most
  ``max_wait_s`` (then 503, ``Retry-After``).
"""
from __future__ import annotations

DEFAULT_MAX_BODY_BYTES = 4 * 1024 * 1024
DEFAULT_MAX_BATCH = 16
DEFAULT_MAX_CONCURRENT = 32
DEFAULT_MAX_TOTAL = 0       # no gateway-wide bound: nothing waits, as before fair admission
DEFAULT_MAX_WAIT_S = 30.0
RETRY_AFTER_S = 1
