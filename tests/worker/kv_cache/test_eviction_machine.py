"""The state machine of test_state_machine, with layered eviction and pins.

Same random allocate / decode / free / preempt / reset sequences, plus pin, unpin, clock
advances and ticks (a manual clock), against a model that writes the rules the slow way:
two plain lists for the free classes (decode-generated blocks before prefill ones, unhashed
first of all, vLLM's order inside each), pins as a dict keyed by real content. The manager
must agree on every block id handed out, the free queue order, ref counts, evictions and
the pinned set.
"""
from collections import deque

from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import invariant, precondition, rule

from kvmesh.hashing import block_hashes
from tests.worker.kv_cache.test_state_machine import (
    ALGO,
    BS,
    MAX_LEN,
    NUM_BLOCKS,
    TOKENS,
    KVCacheMachine,
)
from worker.kv_cache import KVCacheManager, KVRequest

CAP = 5       # half the pool: pins are often in the way
HOT = 2       # automatic pinning after this many first-admission hits...
WINDOW = 8.0  # ...within this window (also an automatic pin's TTL)


class PinModel:
    """Block-manager rules with eviction classes and pins, over lists and content keys."""

    def __init__(self, layered: bool, auto: bool, clock) -> None:
        self.layered, self.auto, self.clock = layered, auto, clock
        self.first = list(range(NUM_BLOCKS))  # handed out first (all of it under "lru")
        self.second: list[int] = []           # prefill blocks (layered only)
        self.decoded = [False] * NUM_BLOCKS
        self.ref = [0] * NUM_BLOCKS
        self.key: list[tuple | None] = [None] * NUM_BLOCKS
        self.cached: dict[tuple, list[int]] = {}
        self.tables: dict[str, list[int]] = {}
        self.ncached: dict[str, int] = {}
        self.prompt: dict[str, int | None] = {}
        self.seen: set[str] = set()
        self.evictions = 0
        self.pins: dict[tuple, dict] = {}
        self.capped = False  # the last pin stopped at the cap
        self.hits: dict[tuple, deque] = {}
        self.hot: list[list[tuple]] = []

    @property
    def free(self) -> list[int]:
        return self.first + self.second

    def _take(self, b) -> None:
        (self.first if b in self.first else self.second).remove(b)

    def _free_in_order(self, blocks) -> None:
        unhashed = []
        for b in blocks:
            self.ref[b] -= 1
            if self.ref[b] == 0:
                if self.key[b] is None:
                    unhashed.append(b)
                elif self.layered and not self.decoded[b]:
                    self.second.append(b)
                else:
                    self.first.append(b)
        self.first = unhashed + self.first

    def lookup(self, tokens, salt) -> list[int]:
        hits = []
        for i in range((len(tokens) - 1) // BS):
            holders = self.cached.get((salt, tuple(tokens[:(i + 1) * BS])))
            if not holders:
                break
            hits.append(holders[0])
        return hits

    def allocate(self, rid, tokens, salt, computed, num_new, hits):
        table = self.tables.get(rid)
        held = len(table) if table is not None else 0
        new_n = max(0, -(-(computed + num_new) // BS) - held - len(hits))

        def short():
            return new_n + sum(self.ref[b] == 0 for b in hits) > len(self.free)

        if short() and (not self._yield_to(set(table or []) | set(hits), new_n) or short()):
            return None
        if table is None:
            table = self.tables[rid] = []
            self.ncached[rid] = len(hits)
        for b in hits:
            if self.ref[b] == 0:
                self._take(b)
            self.ref[b] += 1
        table += hits
        if hits:
            self._note_hits(rid, hits)
        self.seen.add(rid)
        free = self.free
        new = free[:new_n]
        for b in new:
            self._take(b)
            if self.key[b] is not None:
                self.cached[self.key[b]].remove(b)
                if not self.cached[self.key[b]]:
                    del self.cached[self.key[b]]
                self.key[b] = None
                self.evictions += 1
            self.ref[b] = 1
        table += new
        n_full = min(computed + num_new, len(tokens)) // BS
        prompt = self.prompt[rid]
        for i in range(self.ncached[rid], n_full):
            k = (salt, tuple(tokens[:(i + 1) * BS]))
            self.key[table[i]] = k
            self.cached.setdefault(k, []).append(table[i])
            self.decoded[table[i]] = prompt is not None and (i + 1) * BS > prompt
        self.ncached[rid] = max(self.ncached[rid], n_full)
        return new

    def _note_hits(self, rid, hits) -> None:
        prompt, now = self.prompt[rid], self.clock()
        for i, b in enumerate(hits):
            if prompt is None or (i + 1) * BS <= prompt:
                self.decoded[b] = False
        keys = [self.key[b] for b in hits]
        for k in keys:
            if k in self.pins:
                p = self.pins[k]
                p["exp"] = max(p["exp"], now + p["ttl"])
        if not self.auto or rid in self.seen:
            return
        hot = 0
        for i, k in enumerate(keys):
            times = self.hits.setdefault(k, deque(maxlen=HOT))
            times.append(now)
            if hot == i and len(times) >= HOT and now - times[0] <= WINDOW:
                hot += 1
        if any(k not in self.pins for k in keys[:hot]):
            self.hot.append(keys[:hot])
        if len(self.hits) > 2 * NUM_BLOCKS:
            self.hits = {k: t for k, t in self.hits.items()
                         if k in self.cached and now - t[-1] <= WINDOW}

    def release(self, rid) -> None:
        self._free_in_order(list(reversed(self.tables.pop(rid, []))))
        self.ncached.pop(rid, None)

    def reset(self) -> bool:
        if (len(self.free) + len(self.pins) != NUM_BLOCKS
                or any(self.ref[p["block"]] != 1 for p in self.pins.values())):
            return False
        self.hits.clear()
        self.hot.clear()
        self._release(set(self.pins))
        self.key = [None] * NUM_BLOCKS
        self.cached = {}
        return True

    # --- pins -------------------------------------------------------------------------

    def pin(self, chain, ttl, now, auto=False) -> int:
        """Explicit pins (``auto`` False) displace automatic-only ones at the cap: soonest
        to expire, deepest, first pinned first, each with its descendants."""
        for depth, k in enumerate(chain):
            p = self.pins.get(k)
            if p is not None:
                p["ttl"], p["exp"] = max(p["ttl"], ttl), max(p["exp"], now + ttl)
                p["explicit"] = p["explicit"] or not auto
                continue
            holders = self.cached.get(k)
            if not holders:
                return depth
            while len(self.pins) >= CAP:
                autos = [(p["exp"], -p["depth"], i, key)
                         for i, (key, p) in enumerate(self.pins.items()) if not p["explicit"]]
                if auto or not autos:
                    self.capped = True
                    return depth
                self._release({min(autos)[3]})
            b = holders[0]
            if self.ref[b] == 0:
                self._take(b)
            self.ref[b] += 1
            self.pins[k] = {"block": b, "parent": chain[depth - 1] if depth else None,
                            "depth": depth, "ttl": ttl, "exp": now + ttl,
                            "explicit": not auto}
        return len(chain)

    def _release(self, roots) -> list[dict]:
        gone = set(roots)
        for k, p in sorted(self.pins.items(), key=lambda kv: kv[1]["depth"]):
            if p["parent"] in gone:
                gone.add(k)
        out = sorted((self.pins.pop(k) for k in list(self.pins) if k in gone),
                     key=lambda p: -p["depth"])
        self._free_in_order([p["block"] for p in out])
        return out

    def unpin(self, chain) -> int:
        for k in chain:
            self.hits.pop(k, None)
        return len(self._release({k for k in chain if k in self.pins}))

    def tick(self, now) -> int:
        n = len(self._release({k for k, p in self.pins.items() if p["exp"] <= now}))
        hot, self.hot = self.hot, []
        for chain in hot:
            self.pin(chain, WINDOW, now, auto=True)
        return n

    def _yield_to(self, mine, new_n) -> bool:
        if not self.pins:
            return False
        outside = sum(p["block"] not in mine for p in self.pins.values())
        excess = len(mine) + new_n + outside - NUM_BLOCKS
        if excess <= 0:
            return False
        freed = 0
        order = sorted(self.pins.items(),
                       key=lambda kv: (kv[1]["explicit"], kv[1]["exp"], -kv[1]["depth"]))
        for k, _ in order:
            if freed >= excess:
                break
            if k in self.pins:
                freed += sum(p["block"] not in mine for p in self._release({k}))
        return freed > 0


class EvictionMachine(KVCacheMachine):
    LAYERED = True
    AUTO = True

    def __init__(self) -> None:
        super().__init__()
        self.now = 0.0
        self.m = KVCacheManager(NUM_BLOCKS, BS, hash_algo=ALGO,
                                eviction="layered" if self.LAYERED else "lru",
                                auto_pin=self.AUTO, pin_cap=CAP, clock=lambda: self.now)
        self.m.pins.hot_hits, self.m.pins.window_s = HOT, WINDOW
        self.model = PinModel(self.LAYERED, self.AUTO, lambda: self.now)

    @rule(system=st.sampled_from([(), (0, 1, 2, 0), (2, 2)]),
          prompt=st.lists(TOKENS, min_size=1, max_size=MAX_LEN - 8),
          salt=st.sampled_from([None, "s"]), chunk=st.integers(1, MAX_LEN),
          all_prompt=st.booleans())
    def arrive(self, system, prompt, salt, chunk, all_prompt):
        """A prompt, often after a shared "system prompt" (so chains get hot)."""
        prompt = list(system) + prompt
        rid = f"r{self.n}"
        n_prompt = None if all_prompt else len(prompt)
        req = KVRequest(rid, prompt, salt=salt, num_prompt_tokens=n_prompt)
        self.model.prompt[rid] = n_prompt
        self.n += 1
        (self.running if self._admit(req, chunk) else self.waiting).append(req)

    def _chain(self, tokens, salt):
        hashes = block_hashes(tokens, BS, algo=ALGO, salt=salt)
        keys = [(salt, tuple(tokens[:(i + 1) * BS])) for i in range(len(hashes))]
        for k, h in zip(keys, hashes, strict=True):
            self.hash_of[k] = h
        return hashes, keys

    def _pin(self, tokens, salt, ttl, data):
        hashes, keys = self._chain(tokens, salt)
        cut = len(keys) - data.draw(st.integers(0, len(keys)))  # mostly the whole chain
        self.model.capped = False
        pinned = self.m.pin(hashes[:cut], ttl)
        assert pinned == self.model.pin(keys[:cut], ttl, self.now)
        assert (pinned.of, pinned.capped) == (cut, self.model.capped)  # a short pin says why

    @precondition(lambda self: self.model.cached)
    @rule(data=st.data(), ttl=st.sampled_from([2.0, 5.0, 30.0]))
    def pin_cached(self, data, ttl):
        """Pin a cached block's chain, sometimes running past what is cached."""
        salt, prefix = data.draw(st.sampled_from(sorted(self.model.cached, key=repr)))
        self._pin(list(prefix) + data.draw(st.lists(TOKENS, max_size=2 * BS)), salt, ttl, data)

    @rule(data=st.data(), tokens=st.lists(TOKENS, max_size=MAX_LEN),
          salt=st.sampled_from([None, "s"]), ttl=st.sampled_from([2.0, 5.0, 30.0]))
    def pin_tokens(self, data, tokens, salt, ttl):
        self._pin(tokens, salt, ttl, data)

    @precondition(lambda self: self.model.pins)
    @rule(data=st.data())
    def unpin(self, data):
        salt, prefix = data.draw(st.sampled_from(sorted(self.model.pins, key=repr)))
        hashes, keys = self._chain(list(prefix), salt)
        assert self.m.unpin(hashes[-1:]) == self.model.unpin(keys[-1:])

    @rule(dt=st.sampled_from([0.5, 1.0, 3.0, 10.0]))
    def advance(self, dt):
        """Time passes, then a step starts (the manager's tick)."""
        self.now += dt
        self.tick()

    @rule()
    def tick(self):
        assert self.m.expire_pins() == self.model.tick(self.now)

    @invariant()
    def pins_match_the_model(self):
        pins = self.m.pins
        assert self.m.num_pinned_blocks == len(self.model.pins) <= CAP
        assert {self._hash(k): p["block"] for k, p in self.model.pins.items()} == {
            h: pins.get(h).block.block_id for h in pins._pins}
        assert {self._hash(k) for k, p in self.model.pins.items() if p["explicit"]} == {
            h for h, p in pins._pins.items() if p.explicit}
        for pin in pins._pins.values():  # an explicit pin hangs from explicit pins only
            assert not pin.explicit or pin.parent is None or pins.get(pin.parent).explicit
        for pin in pins._pins.values():
            assert pin.block.ref_cnt >= 1 and pin.block.block_hash is not None
            assert pin.parent is None or pin.parent in pins._pins  # closed: from block 0
        if self.LAYERED:  # the split between the classes, not only their concatenation
            assert [b.block_id for b in self.m.pool.free_queue.layer(0)] == self.model.first
        else:
            assert not self.model.second


# More examples than the plain machine: pins in the way of a request need long runs. A
# longer exploration (1500 examples x 80 steps per machine) passed when this was written.
EvictionMachine.TestCase.settings = settings(max_examples=100, stateful_step_count=60,
                                             deadline=None)
TestLayeredWithPins = EvictionMachine.TestCase


class LayeredOnly(EvictionMachine):
    AUTO = False


class LruWithPins(EvictionMachine):
    LAYERED = False


LayeredOnly.TestCase.settings = EvictionMachine.TestCase.settings
LruWithPins.TestCase.settings = EvictionMachine.TestCase.settings
TestLayeredOnly = LayeredOnly.TestCase
TestLruWithPins = LruWithPins.TestCase
