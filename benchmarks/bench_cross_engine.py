"""Benchmark: the same GGUF on llama.cpp and on MLX (converted by labkit.artifacts.mlx_convert).

For each workload's first prompt: how many of the first N greedy tokens the engines
agree on, and at the first divergence each engine's logit gap (its own token minus the
other engine's). Then the plain decode step (one row, logits for it) and a 4-row verify
on both engines at the same KV depth, engines interleaved round by round, as median and
range. On Linux the MLX numbers come from the mlx-cpu build: correctness only, not for
speed claims. Prints JSON as its last line.

    python benchmarks/bench_cross_engine.py [--n 32] [--rounds 5] [--reps 8]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import time

import numpy as np

from labkit.analysis.stats import spread
from labkit.artifacts import zoo
from labkit.artifacts.mlx_convert import resolve_mlx_model
from labkit.engines.llamacpp import LlamaCppEngine
from labkit.engines.mlx import LINUX_NOTE, MlxEngine
from labkit.measure.crossengine import cross_engine_agreement
from labkit.measure.verify_cost import context_ids
from labkit.provenance import fingerprint
from labkit.suites.workloads import WORKLOADS, load_workload

LABEL = "Linux mlx-cpu: correctness only, not for speed claims"


def time_rows(engine, rows: list[int], depth: int) -> float:
    """ms of one decode of ``rows`` at KV depth ``depth`` (the engine synchronises before returning)."""
    t0 = time.perf_counter()
    engine.decode(rows, all_logits=True)
    dt = time.perf_counter() - t0
    engine.rollback(depth)
    return dt * 1e3


def step_times(engs: dict, *, depth: int, rounds: int, reps: int, m_values=(1, 4), seed: int = 0) -> dict:
    """Interleaved: every round visits each engine (random order), ``reps`` decodes per m."""
    any_e = next(iter(engs.values()))
    ctx = context_ids(any_e, depth, seed=seed)
    rows = context_ids(any_e, max(m_values), seed=seed + 1)
    for e in engs.values():
        e.rollback(0)
        e.decode(ctx, all_logits=False)
        for m in m_values:  # warm-up through the measured path
            time_rows(e, rows[:m], depth)
    samples = {name: {m: [] for m in m_values} for name in engs}
    rng = np.random.default_rng(seed)
    for _ in range(rounds):
        for name in rng.permutation(list(engs)):
            for m in m_values:
                samples[name][m] += [time_rows(engs[name], rows[:m], depth) for _ in range(reps)]
    for e in engs.values():
        e.rollback(0)
    return {name: {f"m{m}_ms": spread(v) for m, v in per.items()} for name, per in samples.items()}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default=zoo.EMBEDDED, help="zoo name of a gemma3 GGUF")
    ap.add_argument("--n", type=int, default=32, help="greedy tokens compared per prompt")
    ap.add_argument("--rounds", type=int, default=5, help="interleaved timing rounds")
    ap.add_argument("--reps", type=int, default=8, help="decodes per engine and m in each round")
    ap.add_argument("--kv-depth", type=int, default=200)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--workloads", default=",".join(WORKLOADS))
    args = ap.parse_args()

    art = zoo.get(args.model)
    mart = resolve_mlx_model(args.model)
    llama = LlamaCppEngine(art.path, n_ctx=2048, n_threads=args.threads, artifact=art.describe())
    mlx = MlxEngine(mart.path, n_ctx=2048, n_threads=args.threads, artifact=mart.describe())
    agreement = {}
    for w in args.workloads.split(","):
        p = load_workload(w)[0]
        ids = llama.tokenize(p.text)
        if mlx.tokenize(p.text) != ids:
            raise SystemExit(f"{w}/{p.id}: the engines tokenize differently")
        agreement[w] = {"prompt": p.id, **cross_engine_agreement(llama, mlx, ids, n=args.n)}
        print(f"{w}: agreed {agreement[w]['agreed']}/{args.n}", flush=True)
    load_before = os.getloadavg()
    times = step_times({"llama.cpp": llama, "mlx": mlx}, depth=args.kv_depth, rounds=args.rounds, reps=args.reps)
    out = {
        "kind": "cross_engine",
        "label": LABEL if platform.system() == "Linux" else None,
        "reference": "llama.cpp",
        "n": args.n,
        "agreement": agreement,
        "agreed_all": all(a["identical"] for a in agreement.values()),
        "step_ms": times,
        "timing": {"kv_depth": args.kv_depth, "rounds": args.rounds, "reps": args.reps,
                   "order": "interleaved: each round visits both engines in a random order",
                   "loadavg_before": load_before, "loadavg_after": os.getloadavg(),
                   "mlx_note": LINUX_NOTE if platform.system() == "Linux" else None},
        "engines": {"llama.cpp": llama.describe(), "mlx": mlx.describe()},
        "provenance": fingerprint.collect(),
    }
    llama.close()
    mlx.close()
    print(json.dumps(out))


if __name__ == "__main__":
    main()
