"""Generated token ids -> text deltas, honouring stop strings.

Detokenizing a stream one chunk at a time must not cut a character in two (a multi-byte
UTF-8 character spread over byte tokens, or a BPE piece that only decodes with its
neighbour). ``TextStream`` decodes a short window of recent ids twice, with and without the
new ones, and emits the difference only once it no longer ends in U+FFFD; decoding cost stays
proportional to the window, not to the whole generation.

Stop strings: text is withheld while its end could still become a stop string; once one
appears, the text before it is emitted, ``stopped`` turns true and later input is ignored.
The concatenation of all deltas equals the non-streaming text for the same ids.
"""
from __future__ import annotations

from collections.abc import Iterable

from client.gateway.tokenizer import Tokenizer

REPLACEMENT = "\ufffd"


class TextStream:
    """Feed token ids with ``push``; call ``finish`` once at the end for the remainder."""

    def __init__(self, tokenizer: Tokenizer, stop: Iterable[str] = ()) -> None:
        self._tok = tokenizer
        self._stop = [s for s in stop if s]
        self._ids: list[int] = []
        self._window = 0     # ids before this index are fully reflected in ``_text``
        self._read = 0       # ids before this index were decoded into ``_text``
        self._text = ""      # decoded text not yet emitted or withheld
        self.stopped = False
        self.num_tokens = 0  # ids pushed before the stop (all of them when none matched)

    def push(self, ids: Iterable[int]) -> str:
        """Add generated ids; returns the text that is now safe to emit (maybe empty)."""
        if self.stopped:
            return ""
        new = list(ids)
        self._ids.extend(new)
        self.num_tokens += len(new)
        self._decode(final=False)
        return self._emit(final=False)

    def finish(self) -> str:
        """The remaining text (a trailing cut character decodes to U+FFFD)."""
        if self.stopped:
            return ""
        self._decode(final=True)
        return self._emit(final=True)

    def _decode(self, final: bool) -> None:
        if self._read == len(self._ids):
            return
        before = self._tok.decode(self._ids[self._window:self._read])
        after = self._tok.decode(self._ids[self._window:])
        if not final and (after.endswith(REPLACEMENT) or len(after) <= len(before)):
            return  # wait for the rest of the character
        self._text += after[len(before):]
        self._window, self._read = self._read, len(self._ids)

    def _emit(self, final: bool) -> str:
        text = self._text
        if self._stop:
            cut = min((i for i in (text.find(s) for s in self._stop) if i >= 0), default=-1)
            if cut >= 0:
                self.stopped = True
                self._text = ""
                return text[:cut]
        keep = 0 if final else self._held_back(text)
        out, self._text = text[:len(text) - keep], text[len(text) - keep:]
        return out

    def _held_back(self, text: str) -> int:
        """Length of the longest end of ``text`` that starts some stop string."""
        best = 0
        for stop in self._stop:
            for n in range(min(len(stop) - 1, len(text)), best, -1):
                if stop.startswith(text[-n:]):
                    best = n
                    break
        return best
