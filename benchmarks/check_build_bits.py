"""Check: do two or more llama.cpp builds give the same bits? (a kernel patch must change time only)

Each build is a library folder (``libllama.so`` and its ``libggml*.so``) loaded by its own
process through ``LLAMA_CPP_LIB_PATH``. Each process decodes the same seeded context (KV depth
200), then every verify m = 1..16 with every logit row, and a 64-token greedy run from the
context; also, within the build, row j of the 16-row verify against the plain step at that
position (what greedy speculation needs to equal plain). The first build is the reference:
for every other, the largest |logit difference| per m and whether the greedy tokens agree.

    python benchmarks/check_build_bits.py [NAME=]LIBDIR [NAME=]LIBDIR ... [--model NAME]

Measured (2026-12-04, AMD EPYC family 26): the tinyBLAS patch, with and without its
one-column part, gives the unpatched build's bits at every m, on the embedded model and on
``synthetic-small-vocab``, with the portable and the AVX-512 flags; the AVX-512 flags give
other bits than the portable ones. Prints JSON as its last line; exit 1 when a build differs.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np
from bench_verify_kernels import parse_builds  # [NAME=]LIBDIR

# every m of the patch's column paths: 1..8 (one group) and 9..16 (two groups of the same row)
M_VALUES = tuple(range(1, 17))


def worker(model: str, out: str) -> None:
    from labkit.artifacts import zoo
    from labkit.engines.llamacpp import LlamaCppEngine, build_info
    from labkit.measure.verify_cost import context_ids

    e = LlamaCppEngine(zoo.get(model).path, n_ctx=1024, n_threads=2)
    ctx, rows = context_ids(e, 200, seed=0), context_ids(e, max(M_VALUES), seed=1)
    res = {}
    for m in M_VALUES:
        e.rollback(0)
        e.decode(ctx, all_logits=False)
        e.decode(rows[:m], all_logits=True)
        res[f"m{m}"] = np.stack([e.logits(i) for i in range(m)])
    e.rollback(200)
    plain = []
    for t in rows:  # the plain steps at the 16-row verify's positions
        e.decode([t], all_logits=False)
        plain.append(e.logits(-1).copy())
    res["plain"] = np.stack(plain)
    e.rollback(0)
    e.decode(ctx[:40], all_logits=False)
    greedy = []
    for _ in range(64):
        greedy.append(int(np.argmax(e.logits(-1))))
        e.decode([greedy[-1]], all_logits=False)
    res["greedy"] = np.array(greedy)
    np.savez(out, **res)
    info = build_info()
    print(json.dumps({"lib_path": info.get("lib_path"), "system_info": info.get("system_info")}), flush=True)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("libs", nargs="*", help="[NAME=]LIBDIR; the first is the reference")
    ap.add_argument("--model", default="gemma-3-270m-q4_k_m")
    ap.add_argument("--worker", nargs=2, metavar=("MODEL", "OUT"), help=argparse.SUPPRESS)
    a = ap.parse_args(argv)
    if a.worker:
        worker(*a.worker)
        return 0
    if len(a.libs) < 2:
        raise SystemExit("error: give two or more library folders to compare\n"
                         "fix: e.g. check_build_bits.py upstream=/path/a/bin patched=/path/b/bin")
    builds = parse_builds(a.libs)
    got = {}
    with tempfile.TemporaryDirectory() as tmp:
        for name, d in builds.items():
            out = str(Path(tmp) / f"{name}.npz")
            r = subprocess.run([sys.executable, __file__, "--worker", a.model, out], capture_output=True, text=True,
                               env={**os.environ, "LLAMA_CPP_LIB_PATH": d}, timeout=600)
            if r.returncode != 0:
                raise SystemExit(f"error: the worker for {name} failed (exit {r.returncode}):\n{r.stderr[-2000:]}")
            got[name] = dict(np.load(out))
    ref_name, ref = next(iter(got.items()))
    report = {"kind": "build_bits", "model": a.model, "reference": ref_name, "builds": {}}
    same_all = True
    for name, g in got.items():
        last = max(M_VALUES)
        row = {"batch_vs_plain_max_abs": [float(np.abs(g[f"m{last}"][j] - g["plain"][j]).max()) for j in range(last)]}
        if name != ref_name:
            diff = {m: float(np.abs(g[f"m{m}"] - ref[f"m{m}"]).max()) for m in M_VALUES}
            row.update({"max_abs_by_m": diff, "greedy_equal": bool((g["greedy"] == ref["greedy"]).all()),
                        "same_bits": all(v == 0.0 for v in diff.values())})
            same_all &= row["same_bits"]
            print(f"{name} vs {ref_name}: " + (f"the same bits at every m = 1..{last}" if row["same_bits"] else
                  "differs: max |Δlogit| " + ", ".join(f"m={m} {v:.3g}" for m, v in diff.items()))
                  + f"; greedy 64 tokens {'equal' if row['greedy_equal'] else 'differ'}", file=sys.stderr)
        report["builds"][name] = row
        print(f"{name}: the {last}-row verify's rows against the plain steps there, max |Δlogit|: "
              + " ".join(f"{v:.2g}" for v in row["batch_vs_plain_max_abs"]), file=sys.stderr)
    report["same_bits"] = same_all
    print(json.dumps(report))
    return 0 if same_all else 1


if __name__ == "__main__":
    sys.exit(main())
