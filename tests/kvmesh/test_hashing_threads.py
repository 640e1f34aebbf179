"""Every public hashing function is safe under concurrent use.

The fast CBOR path keeps a process-wide table of token encodings that is built on first use.
A race while it is built poisons it for the life of the process, so each round runs against
a fresh module state: the hammer runs in a subprocess that reloads ``kvmesh.hashing`` before
every round, starts 8 threads at one barrier and compares every hash with cbor2 + hashlib.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

HAMMER = textwrap.dedent("""
    import hashlib, importlib, json, random, sys, threading
    import cbor2, xxhash
    import kvmesh.hashing as h

    sys.setswitchinterval(1e-6)  # switch threads as often as CPython allows

    def reference(tokens, block_size, algo, salt=None):
        dig = ((lambda b: hashlib.sha256(b).digest()) if algo == "sha256_cbor"
               else xxhash.xxh3_128_digest)
        parent, out = dig(cbor2.dumps("vllm-none-hash", canonical=True)), []
        for start in range(0, len(tokens) - block_size + 1, block_size):
            extra = (("cache_salt", salt),) if salt and start == 0 else None
            data = cbor2.dumps((parent, tuple(tokens[start:start + block_size]), extra),
                               canonical=True)
            parent = dig(data)
            out.append(parent)
        return out

    def work(rng):
        # Ids up to 2**17, some small (the first growth) and some large (the second).
        top = rng.choice((1 << 10, 1 << 16, 1 << 17))
        tokens = [rng.randrange(top) for _ in range(rng.randrange(16, 400))]
        bs = rng.choice((1, 4, 16))
        algo = rng.choice(("sha256_cbor", "xxhash_cbor"))
        salt = rng.choice((None, "s"))
        kind = rng.randrange(3)
        if kind == 0:
            got = h.block_hashes(tokens, bs, algo=algo, salt=salt)
        elif kind == 1:
            got = []
            h.extend_block_hashes(got, tokens[:len(tokens) // 2], bs, algo=algo, salt=salt)
            h.extend_block_hashes(got, tokens, bs, algo=algo, salt=salt)
        else:
            salt, got, parent = None, [], h.none_hash(algo)
            for start in range(0, len(tokens) - bs + 1, bs):
                parent = h.hash_block(parent, tokens[start:start + bs], None, algo)
                got.append(parent)
        return got == reference(tokens, bs, algo, salt)

    rounds, threads, calls = (int(a) for a in sys.argv[1:4])
    bad_rounds = 0
    for r in range(rounds):
        importlib.reload(h)  # a fresh, empty encoding table each round
        gate = threading.Barrier(threads)
        wrong = []

        def run(seed):
            rng = random.Random(seed)
            gate.wait()
            for _ in range(calls):
                if not work(rng):
                    wrong.append(seed)

        ts = [threading.Thread(target=run, args=(r * 100 + i,)) for i in range(threads)]
        for t in ts:
            t.start()
        for t in ts:
            t.join()
        # Afterwards, single-threaded: ordinary ids must still hash right.
        after = all(work(random.Random(10_000 + i)) for i in range(20))
        bad_rounds += bool(wrong) or not after
    print(json.dumps({"rounds": rounds, "bad_rounds": bad_rounds}))
""")


def test_eight_threads_hash_like_the_reference():
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    out = subprocess.run([sys.executable, "-c", HAMMER, "10", "8", "6"], env=env, cwd=ROOT,
                         capture_output=True, text=True, timeout=300, check=True)
    result = json.loads(out.stdout.strip().splitlines()[-1])
    assert result == {"rounds": 10, "bad_rounds": 0}
