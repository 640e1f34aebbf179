"""The tiny byte vocabulary: one declaration, the same ids in the worker's model and tokenizer,
the gateway's tokenizer and the HTTP API's."""
from __future__ import annotations

from kvmesh.openai import vocab
from kvmesh.openai.tokenizer import VllmTokenizer


def test_bytes_then_three_specials() -> None:
    assert (vocab.BOS, vocab.EOS, vocab.PAD) == (256, 257, 258)
    assert vocab.VOCAB == vocab.BYTES + 3 == 259


def test_encode_is_utf8_and_decode_drops_specials() -> None:
    ids = vocab.encode("héllo", add_bos=True)
    assert ids[0] == vocab.BOS and ids[1:] == list("héllo".encode())
    assert vocab.decode([*ids, vocab.EOS, vocab.PAD]) == "héllo"


def test_a_cut_character_decodes_to_a_replacement() -> None:
    assert vocab.decode(vocab.encode("é")[:1]) == "\ufffd"


def test_the_http_apis_tokenizer_uses_it() -> None:
    tok = VllmTokenizer.load(vocab.TINY)
    assert tok.vocab_size == vocab.VOCAB and tok.eos_token_id == vocab.EOS
    assert tok.encode("ab") == vocab.encode("ab")
