"""A request's prompt ids, checked before anything is routed: the vocabulary and the context.

Text is tokenized here (as vLLM does with ``--tokenizer``: ``add_special_tokens`` honoured);
a token-id prompt is checked against the vocabulary. Every prompt must leave room for the
tokens it asks for: prompt + ``max_tokens`` within ``--max-model-len`` (400
``context_length_exceeded`` otherwise), so a prompt no worker could take never writes a
provisional entry to the index. A chat without ``max_tokens`` asks for whatever its prompt
leaves of the context (vLLM's default), which is refused only when nothing is left. vLLM
refuses to start with a context its KV cache cannot hold; a kvmesh worker refuses such a
request instead (413), and ``pool_refusal`` then tells the caller that the default did it.
"""
from __future__ import annotations

import grpc

from client.errors import KvmeshError
from client.gateway.errors import from_kvmesh
from client.gateway.tokenizer import Tokenizer
from kvmesh.openai.errors import OpenAIError
from kvmesh.openai.tokenizer import VllmTokenizer


def prompt_ids(tokenizer: Tokenizer, prompt: str | list[int], param: str,
               add_special_tokens: bool = True) -> list[int]:
    """The ids of a text prompt, or a token-id prompt checked against the vocabulary
    (400 naming ``param`` for an id outside it)."""
    if isinstance(prompt, str):
        return (tokenizer.encode(prompt, add_special_tokens)
                if isinstance(tokenizer, VllmTokenizer) else tokenizer.encode(prompt))
    ids = list(prompt)
    bad = next((t for t in ids if not 0 <= t < tokenizer.vocab_size), None)
    if bad is not None:
        raise OpenAIError(400, f"token id {bad} is outside the vocabulary "
                          f"[0, {tokenizer.vocab_size})", param=param)
    return ids


def fitted(ids: list[int], param: str, max_tokens: int, context: int) -> list[int]:
    """``ids``, checked to be a prompt that fits ``context`` with ``max_tokens`` more (< 1:
    a default that left nothing to generate); raises a 400 ``OpenAIError`` naming
    ``param``."""
    if not ids:
        raise OpenAIError(400, "the prompt is empty", param=param)
    if max_tokens < 1:
        raise OpenAIError(400, f"this model's maximum context length is {context} tokens and "
                          f"the prompt has {len(ids)}: nothing is left to generate",
                          param=param, code="context_length_exceeded")
    if len(ids) + max_tokens > context:
        raise OpenAIError(400, f"this model's maximum context length is {context} tokens; "
                          f"the prompt has {len(ids)} and max_tokens asks for {max_tokens}",
                          param=param, code="context_length_exceeded")
    return ids


def pool_refusal(err: KvmeshError, context: int) -> OpenAIError:
    """The answer to ``err`` for a chat whose ``max_tokens`` defaulted to the context: a
    worker's refusal as larger than its KV pool (413) says that the default asked for it."""
    answer = from_kvmesh(err)
    if err.code == grpc.StatusCode.RESOURCE_EXHAUSTED:
        answer.message += (f" (max_tokens was not given, so it defaults to what the context of "
                           f"{context} tokens leaves after the prompt: send max_tokens, or "
                           "start the gateway with a --max-model-len the workers' KV pools "
                           "hold)")
    return answer
