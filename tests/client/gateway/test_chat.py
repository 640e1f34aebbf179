"""The chat template and message text of the gateway."""
from __future__ import annotations

import pytest

from client.gateway.chat import ChatFormatError, message_text, render_chat


def test_chat_template() -> None:
    prompt = render_chat([("system", "S"), ("user", "U"), ("assistant", "A"), ("user", "V")])
    assert prompt == "<|system|>\nS\n<|user|>\nU\n<|assistant|>\nA\n<|user|>\nV\n<|assistant|>\n"
    assert message_text([{"type": "text", "text": "a"}, {"type": "text", "text": "b"}],
                        "m") == "a\nb"
    assert message_text(None, "m") == ""
    with pytest.raises(ChatFormatError):
        render_chat([])
