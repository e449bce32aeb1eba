"""MODELLED, not measured: the priced draft length policy replayed on plain greedy outputs.

How the policy's settings (``decoding.policy``: CELL_CAP, the context and recalibration
stages) were chosen without touching the held-out prompts of ``bench_policy.py``. Under
greedy decoding a draft token is accepted exactly when plain decoding emits it there, so
one plain run per prompt gives every step's outcome for any draft length
(``analysis.replay``); the policy chooses j from the n-gram drafter's evidence and learns
from the replayed outcomes, one policy across all prompts and rounds as in
``bench_policy.py`` (round 0 a warm-up it learns from). Each step is priced with this
box's verify(m), measured at the start of this run (``analysis.replay.predict_run``,
loop overhead 0): the ratios are the cost model's, for comparing settings, and are no
speedup claim. Fixed k = 1..4 are replayed and priced the same way.

Prompts: the default recipe's own (``prompts_per_workload`` per workload, what the
developers look at); ``--set N`` replays a held-out set of ``bench_policy.py`` instead.

    python benchmarks/replay_policy.py [--cell-caps 20,100,1e9] [--rounds 3] [--max-tokens 64] [--set N]

Prints progress on stderr and JSON as its last line.
"""

from __future__ import annotations

import argparse
import json
import sys

import numpy as np

from labkit.analysis import calibration, costmodel, replay
from labkit.artifacts import zoo
from labkit.config.recipe import load
from labkit.decoding import policy as policies
from labkit.decoding.drafters.ngram import NgramDrafter
from labkit.decoding.loop import run, tokens_of
from labkit.engines.llamacpp import LlamaCppEngine
from labkit.measure import verify_cost
from labkit.provenance import fingerprint
from labkit.suites.workloads import WORKLOADS, load_workload

K_MAX = 8
FIXED = (1, 2, 3, 4)


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def prompts_of(args, recipe) -> dict:
    if args.set is None:
        return {w: load_workload(w)[: recipe.prompts_per_workload] for w in WORKLOADS}
    from bench_policy import held_out  # beside this script

    return held_out(per_workload=args.per_workload, which=args.set, recipe=recipe)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--cell-caps", default=str(policies.CELL_CAP), help="comma-separated CELL_CAP values to replay")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--set", type=int, default=None, help="a held-out set of bench_policy.py (default: the recipe's)")
    ap.add_argument("--per-workload", type=int, default=4)
    ap.add_argument("--verify-rounds", type=int, default=8)
    args = ap.parse_args()
    recipe = load(None)
    sets = prompts_of(args, recipe)
    art = zoo.get(zoo.EMBEDDED)
    eng = LlamaCppEngine(art.path, n_ctx=2048, n_threads=recipe.threads, artifact=art.describe())
    log(f"measuring verify(m), m = 1..{K_MAX + 1}")
    vm = costmodel.fit_verify_model(costmodel.verify_frame(verify_cost.bench_verify(
        eng, m_values=range(1, K_MAX + 2), rounds=args.verify_rounds, kv_depth=recipe.kv_depth)))
    plain = {}
    for w, ps in sets.items():
        for p in ps:
            ids = eng.tokenize(p.text)
            plain[p.id] = (w, ids, tokens_of(run(eng, ids, max_tokens=args.max_tokens)))
            log(f"plain {p.id}: {len(plain[p.id][2])} tokens")
    provenance = fingerprint.collect(engine=eng)
    eng.close()

    def speedup(recs) -> float:
        return replay.predict_run(recs, V=vm.V, H=vm.H)["pred_decode_speedup"]

    fixed = {pid: {k: speedup(replay.replay(ids, out, NgramDrafter(), k, max_tokens=args.max_tokens)) for k in FIXED}
             for pid, (w, ids, out) in plain.items()}
    variants = {}
    for cap in (float(x) for x in args.cell_caps.split(",")):
        pol = policies.PricedPolicy(verify=vm, k_max=K_MAX, drafter_name="ngram", overhead=(0.0, 0.0), cell_cap=cap)
        drafter = NgramDrafter()
        drafter.collect_evidence = True
        auto, recs_all = {}, []
        for pid, (_w, ids, out) in plain.items():
            got = []
            for r in range(args.rounds + 1):
                recs = replay.replay(ids, out, drafter, K_MAX, max_tokens=args.max_tokens, policy=pol)
                if r > 0:
                    got.append(speedup(recs))
                    recs_all += recs
            auto[pid] = float(np.mean(got))
        per_workload = {}
        for w in sets:
            ids_w = [pid for pid, v in plain.items() if v[0] == w]

            def gm(xs):
                return float(np.exp(np.mean(np.log(xs))))

            ks = {f"k{k}": gm([fixed[pid][k] for pid in ids_w]) for k in FIXED}
            best = max(ks, key=ks.get)
            a = gm([auto[pid] for pid in ids_w])
            per_workload[w] = {"auto_vs_plain": a, "fixed_vs_plain": ks, "best_fixed": best, "auto_vs_best": a / ks[best]}
        cal = calibration.table(calibration.samples(recs_all, drafter="ngram"), by=["drafter"])
        variants[f"{cap:g}"] = {"per_workload": per_workload, "calibration": cal.to_dict(orient="records"),
                                "calibration_verdict": calibration.verdict(cal), "policy": pol.describe()}
        log(f"cell_cap {cap:g}: " + "; ".join(f"{w} auto/best {v['auto_vs_best']:.3f}" for w, v in per_workload.items())
            + f" | {calibration.verdict(cal)}")
    print(json.dumps({
        "benchmark": "MODELLED (replayed greedy outcomes priced with the measured verify(m), loop overhead 0): "
                     "the priced policy at each CELL_CAP vs fixed k",
        "prompts": {w: [p.id for p in ps] for w, ps in sets.items()},
        "prompt_source": "the default recipe's" if args.set is None else f"bench_policy.py held-out set {args.set}",
        "rounds": args.rounds, "max_tokens": args.max_tokens,
        "verify_fit": {"H_ms": vm.H, "V_ms": [float(vm.V(m)) for m in range(1, K_MAX + 2)]},
        "variants": variants, "provenance": provenance,
    }, default=float))


if __name__ == "__main__":
    main()
