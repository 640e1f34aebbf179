"""Tiny local tokenizer directories for tests (no downloads): the tiny model's byte vocabulary
as a Hugging Face ``tokenizer.json`` (id of byte b is b; ``<s>`` 256, ``</s>`` 257, ``<pad>``
258, as ``worker.model.loader``'s tiny model), a post-processor adding ``<s>``, and a chat
template of the test's choosing."""
from __future__ import annotations

import json
from pathlib import Path

# A Llama-3-like template: a BOS, role headers, and a generation prompt.
HEADERS = (
    "{{ bos_token }}{% for message in messages %}"
    "{% if message['role'] == 'system' and loop.first %}<|sys|>{{ message['content'] | trim }}\n"
    "{% else %}<|{{ message['role'] }}|>{{ message['content'] }}</|{{ message['role'] }}|>\n"
    "{% endif %}{% endfor %}{% if add_generation_prompt %}<|assistant|>{% endif %}")
# ChatML (Qwen-style) with tools rendered through tojson and a namespace.
CHATML_TOOLS = (
    "{% set ns = namespace(sys=false) %}"
    "{% if tools %}<|im_start|>system\nTools:\n{% for t in tools %}{{ t | tojson }}\n"
    "{% endfor %}<|im_end|>\n{% endif %}"
    "{% for m in messages %}{% if m.role == 'system' %}{% set ns.sys = true %}{% endif %}"
    "<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")
# Iterates over content parts (vLLM hands it the parts, not a joined string).
PARTS = (
    "{% for m in messages %}[{{ m.role }}]"
    "{% if m.content is string %}{{ m.content }}"
    "{% else %}{% for p in m.content %}{% if p.type == 'text' %}({{ p.text }}){% endif %}"
    "{% endfor %}{% endif %}\n{% endfor %}{% if add_generation_prompt %}[assistant]{% endif %}")
# Refuses a conversation that does not alternate user/assistant.
STRICT = (
    "{% for m in messages %}{% if (m.role == 'user') != (loop.index0 % 2 == 0) %}"
    "{{ raise_exception('roles must alternate user/assistant') }}{% endif %}"
    "{{ m.role }}: {{ m.content }}{{ eos_token }}{% endfor %}"
    "{% if add_generation_prompt %}assistant:{% endif %}")
# Written over indented lines, as templates on the Hub are: trim_blocks and lstrip_blocks matter.
INDENTED = """{% for m in messages %}
    {% if m['role'] == 'user' %}
U: {{ m['content'] }}
    {% else %}
A: {{ m['content'] }}
    {% endif %}
{% endfor %}
{% if add_generation_prompt %}
    A:{% endif %}"""


def _bytes_to_unicode() -> dict[int, str]:
    """GPT-2's printable stand-in for every byte (the ByteLevel pre-tokenizer's alphabet)."""
    keep = (list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1))
            + list(range(ord("®"), ord("ÿ") + 1)))
    chars, n = {}, 0
    for b in range(256):
        if b in keep:
            chars[b] = chr(b)
        else:
            chars[b] = chr(256 + n)
            n += 1
    return chars


def byte_tokenizer_dir(path: Path, chat_template: str | None = HEADERS, *,
                       jinja_file: bool = False) -> Path:
    """Write the directory; ``jinja_file`` stores the template in ``chat_template.jinja``."""
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers, processors

    path.mkdir(parents=True, exist_ok=True)
    vocab = {ch: b for b, ch in _bytes_to_unicode().items()}
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens([AddedToken(t, special=True) for t in ("<s>", "</s>", "<pad>")])
    tok.post_processor = processors.TemplateProcessing(
        single="<s> $A", pair="<s> $A $B", special_tokens=[("<s>", 256)])
    tok.save(str(path / "tokenizer.json"))
    config: dict = {"tokenizer_class": "PreTrainedTokenizerFast", "bos_token": "<s>",
                    "eos_token": {"content": "</s>", "special": True, "__type": "AddedToken"},
                    "pad_token": "<pad>", "model_max_length": 8192}
    if chat_template is not None:
        if jinja_file:
            (path / "chat_template.jinja").write_text(chat_template, encoding="utf-8")
        else:
            config["chat_template"] = chat_template
    (path / "tokenizer_config.json").write_text(json.dumps(config), encoding="utf-8")
    return path
