"""The index's Lua files (``service/index/redis/lua/``) and their one loader: every file has
a header naming its KEYS and ARGV, every script loads (includes and constants resolved),
every fragment is used, and a real server compiles every script."""
from __future__ import annotations

import re

import pytest
import redis

from service.index.redis import lua

FILES = sorted(p.stem for p in lua.LUA_DIR.glob("*.lua"))
FRAGMENTS = [n for n in FILES if n.startswith("_")]


def test_the_scripts_and_fragments_are_found() -> None:
    assert len(lua.names()) >= 20 and FRAGMENTS
    assert set(lua.names()) | set(FRAGMENTS) == set(FILES)


@pytest.mark.parametrize("name", FILES)
def test_every_file_has_a_header_naming_its_keys_and_argv(name: str) -> None:
    head = lua.header(name)
    assert all(line.startswith("--") for line in head.splitlines())
    assert re.search(r"\bKEYS\b", head), f"{name}.lua: the header names no KEYS"
    assert re.search(r"\bARGV\b", head), f"{name}.lua: the header names no ARGV"


@pytest.mark.parametrize("name", lua.names())
def test_every_script_loads_resolved(name: str) -> None:
    text = lua.text(name)
    assert text.strip() and "--@include" not in text and "${" not in text
    assert lua.header(name) not in text  # the header is not sent
    assert lua.raw(name).script == text and len(lua.raw(name).sha) == 40


def test_an_include_is_the_fragment_verbatim() -> None:
    """Includes concatenate: ``register`` is ``_prelude`` + ``_register_steps`` + its tail,
    and constants are the layout's values."""
    text = lua.text("register")
    assert text.startswith(f"\nlocal CTL, EB = '{lua.CONSTANTS['CTL']}', "
                           f"{lua.CONSTANTS['ENTRY_BYTES']}\n")
    assert f"if h > {lua.CONSTANTS['MAX_HANDLE']} then" in text
    assert text.endswith("redis.call('HSET', KEYS[2], 'h', h, 'n', 0)\nreturn had\n")


def test_every_fragment_is_included_somewhere() -> None:
    sources = "".join((lua.LUA_DIR / f"{n}.lua").read_text() for n in FILES)
    for frag in FRAGMENTS:
        assert f"--@include {frag[1:]}\n" in sources, f"{frag}.lua is included nowhere"


def test_fragments_are_not_scripts() -> None:
    with pytest.raises(ValueError):
        lua.text(FRAGMENTS[0])


def test_a_real_server_compiles_every_script(redis_url: str) -> None:
    client = redis.Redis.from_url(redis_url)
    try:
        for name in lua.names():
            assert client.script_load(lua.text(name)) == lua.raw(name).sha.decode(), name
    finally:
        client.close()
