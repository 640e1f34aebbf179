"""The one OpenAI surface of kvmesh, torch-free: the gateway and the worker's HTTP API both
speak through it, so a field is validated, a body shaped and an error worded the same way on
each side.

``requests`` (completion and chat bodies, one rule per field), ``responses`` (bodies, stream
chunks, usage), ``errors`` (``OpenAIError``: OpenAI's body and vLLM's), ``vocab`` (the tiny
model's byte vocabulary), ``tokenizer`` and ``chat_template`` (prompt ids as vLLM computes
them).
"""
