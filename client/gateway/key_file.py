"""The two-column files an operator hands the gateway (``--tenant-keys``, ``--engine-keys``):
a JSON object, or lines of whitespace-separated fields with ``#`` comments and blank lines.

:func:`key_file_pairs` only splits; each file's reader checks what its fields mean, so the
messages name that file's columns and never quote a key.
"""
from __future__ import annotations

import json


def key_file_pairs(text: str, what: str, usage: str, *, second_optional: bool,
                   error: type[ValueError]) -> list[tuple[object, object]]:
    """The (first, second) pairs of ``text``: a JSON object's items, or one pair per line
    (``second`` None on a one-field line when ``second_optional``). ``what`` names the file
    and ``usage`` the expected line in ``error``'s messages."""
    if text.lstrip().startswith("{"):
        try:
            data = json.loads(text)
        except ValueError as exc:
            raise error(f"{what}: invalid JSON ({exc})") from None
        return list(data.items())
    pairs: list[tuple[object, object]] = []
    for n, raw in enumerate(text.splitlines(), 1):
        line = raw.split("#", 1)[0].strip()
        if not line:
            continue
        parts = line.split()
        if len(parts) > 2 or (len(parts) < 2 and not second_optional):
            raise error(f"{what} line {n}: expected '{usage}'")
        pairs.append((parts[0], parts[1] if len(parts) == 2 else None))
    return pairs
