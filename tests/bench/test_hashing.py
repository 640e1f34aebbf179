"""The hashing micro-benchmark runs and its comparison holds at a small size."""
from bench import hashing


def test_hashing_bench_is_byte_identical_and_reports_ratios():
    rows = hashing.run(num_tokens=256, block_size=16, repeats=2)
    assert [r["algo"] for r in rows] == ["sha256", "sha256_cbor", "xxhash", "xxhash_cbor"]
    assert all(r["blocks"] == 16 and r["speedup"] > 0 for r in rows)
