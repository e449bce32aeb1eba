"""Benchmark: labkit's multi-slot loop vs llama.cpp's llama-server, aggregate tok/s at the same c.

Same model, same threads, same prompts (token ids), greedy, the same closed-loop request
queue; plain (k = 0) and n-gram speculation (labkit's n-gram drafter vs the server's
``ngram-simple``). Each round runs both engines' (c, k) grids, in an order that
alternates by round (``measure.order``); the ratio labkit / llama-server is taken per
round and reported as median and range.

Target (issue 13): labkit's plain multi-slot aggregate >= 0.9x llama-server's plain
aggregate at c = 4 (both on 2 threads). Prints JSON as its last line.

    python benchmarks/bench_concurrency.py [--c 1,2,4] [--k 0,3] [--rounds 2] [--max-tokens 64]
"""

from __future__ import annotations

import argparse
import json
import sys

import numpy as np

from labkit.analysis.stats import spread
from labkit.artifacts import zoo
from labkit.decoding.drafters.ngram import NgramDrafter
from labkit.engines.llamacpp import LlamaCppEngine, LlamaVocab
from labkit.measure import concurrency, order, serve
from labkit.provenance import fingerprint
from labkit.suites.workloads import load_workload


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--c", default="1,2,4")
    ap.add_argument("--k", default="0,3")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--prompts", type=int, default=4)
    ap.add_argument("--requests", type=int, default=None, help="per run (default: max(c, prompts))")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--workload", default="edit")
    args = ap.parse_args()
    cs = [int(x) for x in args.c.split(",")]
    ks = [int(x) for x in args.k.split(",")]
    log = lambda m: print(m, file=sys.stderr, flush=True)  # noqa: E731

    built = serve.ensure_built(progress=log)
    art = zoo.get(zoo.EMBEDDED)
    texts = [p.text for p in load_workload(args.workload, limit=args.prompts)]
    eng = None
    try:
        vocab = LlamaVocab.load(art.path)
        ids = [vocab.tokenize(t) for t in texts]
        vocab.close()
        per = concurrency.n_ctx_per_seq(ids, max_tokens=args.max_tokens, ks=ks, n_ctx=8192)
        eng = LlamaCppEngine(art.path, n_ctx=per * max(cs), n_seq_max=max(cs), kv_unified=True,
                             n_threads=args.threads, artifact=art.describe())
        agg: dict[tuple, list[float]] = {}
        accept: dict[tuple, list] = {}
        for r in range(args.rounds):
            for which in order.arm_order(("labkit", "llama-server"), r, policy="abba"):
                if which == "labkit":
                    res = concurrency.bench_concurrency(eng, ids, cs=cs, ks=ks, make_drafter=NgramDrafter, runs=1,
                                                        n_requests=args.requests, max_tokens=args.max_tokens,
                                                        seed=r, check_lossless=False, progress=log)
                else:
                    res = serve.bench_serve(built["path"], str(art.path), ids, cs=cs, ks=ks, spec_type="ngram-simple",
                                            threads=args.threads, n_ctx_per_slot=per, runs=1,
                                            n_requests=args.requests, max_tokens=args.max_tokens, seed=r,
                                            progress=log)
                for row in res["rows"]:
                    agg.setdefault((which, row["c"], row["k"]), []).append(row["agg_tok_s"])
                    accept.setdefault((which, row["c"], row["k"]), []).append(row["acceptance"])
        describe = eng.describe()
    finally:
        if eng is not None:
            eng.close()

    table = {f"{w}_c{c}_k{k}": spread(v) for (w, c, k), v in sorted(agg.items())}
    ratios = {f"c{c}_k{k}": spread([a / b for a, b in zip(agg[("labkit", c, k)], agg[("llama-server", c, k)],
                                                           strict=True)])
              for c in cs for k in ks}
    speedups = {f"{w}_c{c}_k{k}": float(np.median(agg[(w, c, k)]) / np.median(agg[(w, c, 0)]))
                for w in ("labkit", "llama-server") for c in cs for k in ks if k and 0 in ks}
    target_c = 4 if 4 in cs else max(cs)
    res = {
        "benchmark": "labkit multi-slot loop vs llama-server: aggregate tok/s at the same c",
        "workload": args.workload, "prompts": len(ids), "max_tokens": args.max_tokens, "rounds": args.rounds,
        "threads": args.threads, "cs": cs, "ks": ks,
        "agg_tok_s": table,
        "acceptance": {f"{w}_c{c}_k{k}": (float(np.median([a for a in v if a is not None]))
                                          if any(a is not None for a in v) else None)
                       for (w, c, k), v in sorted(accept.items())},
        "ratio_labkit_vs_server": ratios,
        "spec_speedup": speedups,
        "target": {"what": f"labkit plain >= 0.9x llama-server plain at c={target_c}",
                   "ratio": ratios[f"c{target_c}_k0"]["median"] if 0 in ks else None,
                   "met": (ratios[f"c{target_c}_k0"]["median"] >= 0.9) if 0 in ks else None},
        "llama_server": built,
        "provenance": {**fingerprint.collect(), "engine": describe},
    }
    print(json.dumps(res))


if __name__ == "__main__":
    main()
