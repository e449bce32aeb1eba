"""Benchmark: what verifying a pinned model checksum costs.

A pinned ``model_sha256`` is checked against the bytes once per change of the file
(``zoo.stat_key``: size, mtime, inode, device, ctime). This measures the two sides of that
choice on the embedded model (253 MB): hashing its bytes (sha256, 1 MiB reads; the first
read may come from disk, later ones from the page cache) and reading its stat key (what
every later open costs instead). Prints JSON as its last line.

    python benchmarks/bench_hash.py [--reps 5]
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import time

from labkit.artifacts import zoo


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--reps", type=int, default=5, help="hashes of the whole file (default 5)")
    args = p.parse_args(argv)
    art = zoo.get(zoo.EMBEDDED)
    hash_s = []
    for _ in range(args.reps):
        t0 = time.perf_counter()
        sha = zoo.sha256_file(art.path)
        hash_s.append(time.perf_counter() - t0)
        assert sha == art.sha256, "the embedded model no longer hashes to its pinned sha256"
    stat_s = []
    for _ in range(1000):
        t0 = time.perf_counter()
        zoo.stat_key(art.path)
        stat_s.append(time.perf_counter() - t0)
    mb = art.size / 1e6
    out = {
        "benchmark": "sha256 of the embedded model vs its stat key",
        "host": platform.processor() or platform.machine(),
        "file_mb": round(mb, 1),
        "hash_s": {"median": round(statistics.median(hash_s), 3), "min": round(min(hash_s), 3),
                   "max": round(max(hash_s), 3), "first": round(hash_s[0], 3)},
        "hash_mb_per_s": round(mb / statistics.median(hash_s), 1),
        "stat_key_us": round(statistics.median(stat_s) * 1e6, 1),
        "note": "timings on a shared machine are contended; compare ratios, not absolutes",
    }
    print(json.dumps(out))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
