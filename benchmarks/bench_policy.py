"""Benchmark: the priced draft length policy (``k: auto``) vs plain and the best fixed k,
per workload, on held-out prompts; and vs llama-cpp-python's LlamaPromptLookupDecoding.

Held-out prompts, chosen before any result was seen: the default recipe measures the
first ``prompts_per_workload`` prompts of each workload; of the rest, a seeded
permutation (numpy default_rng(27), 27 = the issue) per workload is cut into sets of
``--per-workload`` prompts, and ``--set`` picks which one (set 0 and set 1 are disjoint).

Arms, in a fresh random order every round on every prompt (``measure.order``): plain
(k = 0), the A/A control (``aa``: plain again, its ratio to plain is the run's own noise;
``decide.aa_problem`` says when it makes the verdicts unreliable), ngram at fixed k = 1..4,
and ngram with the priced policy (``auto``, k_max 8).
The policy is one object for the whole run (it learns online across prompts, as a
server would; round 0 is an unrecorded warm-up that it also learns from); it prices
steps with verify(m) measured at the start of this run. Each ratio (arm/plain, auto/best
fixed k, auto/peer) is paired by prompt and round and goes through the decisions API
(``analysis.decide.estimate``: geometric mean, Student t CI over the prompt means of the
rounds, verdict against ±2%). The best fixed k of a workload is picked from the same
data (by its estimated ratio to plain), so auto/best is conservative for auto.

Lossless (greedy): every arm's output is compared with plain's, token for token
(``greedy_outputs_equal_plain``); an output that differs is explained by the verify
oracle and the logit gap at the first differing token (``divergences``; ``lossless``
is false for an arm only when a divergence is not a numerical near-tie of the batched
kernels or the oracle finds an accepted draft that was not the argmax).

Peer (edit prompts only): LlamaPromptLookupDecoding at num_pred_tokens --peer-k on the
same model, threads and prompts, decode tok/s as in ``bench_lookup.py``; best by median.

At c > 1 (``--c 4``): labkit's multi-slot loop (``measure.concurrency.bench_concurrency``)
on the same held-out prompts, each workload's prompts cycled into max(c, prompts)
requests, arms plain, the A/A control, fixed k = 1..4 and auto (one policy per workload
for all its rounds, choosing every stream's j together), interleaved by round. The unit
of pairing is the round (every request through both arms); per workload the interval is
over rounds, pooled it is over workloads (rounds averaged within each).

    python benchmarks/bench_policy.py [--per-workload 2] [--rounds 3] [--max-tokens 64] [--set 0] [--c 1]

Prints progress on stderr and JSON as its last line.
"""

from __future__ import annotations

import argparse
import json
import sys
import time

import numpy as np
import pandas as pd

from labkit.analysis import calibration, costmodel, decide, lossless
from labkit.analysis.stats import summarize, tokens_from
from labkit.artifacts import zoo
from labkit.config.recipe import load
from labkit.decoding import policy as policies
from labkit.decoding.drafters.ngram import NgramDrafter
from labkit.decoding.loop import run
from labkit.engines.llamacpp import LlamaCppEngine
from labkit.measure import order, verify_cost
from labkit.provenance import fingerprint
from labkit.suites.workloads import WORKLOADS, load_workload

SEED = 27
FIXED = (1, 2, 3, 4)
K_MAX = 8


class LineOnly(costmodel.VerifyModel):
    """The verify model as it priced before each measured m was priced at its median: H, then
    the fitted line (``--line-arm``)."""

    def V(self, m):
        return self.fitted(m)


def held_out(*, per_workload: int, which: int, recipe) -> dict:
    """The held-out prompts per workload (see the module docstring)."""
    out = {}
    for w in WORKLOADS:
        prompts = load_workload(w)[recipe.prompts_per_workload:]
        perm = np.random.default_rng([SEED, WORKLOADS.index(w)]).permutation(len(prompts))
        pick = perm[which * per_workload:(which + 1) * per_workload]
        out[w] = [prompts[i] for i in sorted(pick)]
    return out


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def peer_run(llm, ids: list[int], n: int) -> float:
    """llama-cpp-python's Llama.generate (greedy): decode tok/s excluding the first token."""
    out, t_first = [], None
    for tok in llm.generate(ids, temp=0.0, top_k=1, reset=True):
        out.append(tok)
        if t_first is None:
            t_first = time.perf_counter()
        if len(out) >= n:
            break
    return (len(out) - 1) / (time.perf_counter() - t_first)


def explain(eng, ids, outs: dict, identical: dict, **where) -> list[dict]:
    """Greedy: every arm's output must be plain's, token for token (``identical`` per arm,
    updated in place). Each output that is not is explained as the decisions' lossless
    checks do: the verify oracle replays the run's own batches (every accepted draft the
    argmax of the row that verified it), and ``divergence_report`` gives the logit gap at
    the first differing token (a numerical near-tie of batched vs single-row kernels, or
    not). Returns one record per differing output."""
    ref = outs["plain"][0]
    want = tokens_from(ref)
    out = []
    for name, runs in outs.items():
        for i, recs in enumerate(runs):
            same = tokens_from(recs) == want
            identical[name] = identical.get(name, True) and same
            if same:
                continue
            rep = lossless.divergence_report(eng, ids, ref, recs)
            bad = lossless.verify_oracle(eng, ids, recs) if name != "plain" else []
            out.append({**where, "arm": name, "round": i, "oracle_violations": len(bad),
                        "lossless": rep["lossless"] and not bad, **rep["divergence"]})
    return out


def estimate(pairs: list[dict]):
    return decide.estimate(pd.DataFrame(pairs), margin=0.02, confidence=0.95)


def est(pairs: list[dict]) -> dict:
    return _est_dict(estimate(pairs))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--per-workload", type=int, default=2)
    ap.add_argument("--set", type=int, default=0, help="which held-out set (0, 1, ...)")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--workloads", default=",".join(WORKLOADS))
    ap.add_argument("--peer-k", default="2,3,4,8", help="LlamaPromptLookupDecoding num_pred_tokens values")
    ap.add_argument("--verify-rounds", type=int, default=8)
    ap.add_argument("--line-arm", action="store_true",
                    help="also auto_line: the same policy priced with the fitted line (a + b*m + odd-m) instead of "
                         "each measured m's median (costmodel.VerifyModel), interleaved; auto vs auto_line per workload")
    ap.add_argument("--c", type=int, default=1, help="concurrent streams (c > 1: the multi-slot loop)")
    args = ap.parse_args()
    recipe = load(None)
    wls = args.workloads.split(",")
    sets = {w: p for w, p in held_out(per_workload=args.per_workload, which=args.set, recipe=recipe).items()
            if w in wls}
    n = args.max_tokens
    art = zoo.get(zoo.EMBEDDED)
    eng = LlamaCppEngine(art.path, n_ctx=2048, n_threads=args.threads, artifact=art.describe())
    log(f"measuring verify(m), m = 1..{K_MAX + 1}")
    ver = verify_cost.bench_verify(eng, m_values=range(1, K_MAX + 2), rounds=args.verify_rounds, kv_depth=200)
    vm = costmodel.fit_verify_model(costmodel.verify_frame(ver))
    if args.c > 1:
        eng.close()
        print(json.dumps(at_concurrency(args, sets, art, vm, recipe), default=float))
        return
    auto_drafter = NgramDrafter()
    pol = policies.make("priced", k_max=K_MAX, drafter=auto_drafter, verify=vm)
    line_drafter = NgramDrafter() if args.line_arm else None
    line_pol = policies.make("priced", k_max=K_MAX, drafter=line_drafter, verify=LineOnly(H=vm.H, fit=vm.fit)) \
        if args.line_arm else None

    peer_ks = [int(x) for x in args.peer_k.split(",")]
    peer = None
    if "edit" in sets:
        import llama_cpp
        from llama_cpp.llama_speculative import LlamaPromptLookupDecoding

        kw = dict(model_path=str(art.path), n_ctx=1024, n_threads=args.threads, n_threads_batch=args.threads,
                  verbose=False)
        lookup = LlamaPromptLookupDecoding(num_pred_tokens=peer_ks[0])
        peer = (llama_cpp.Llama(**kw, draft_model=lookup), lookup)

    arms = [("plain", 0), ("aa", 0)] + [(f"k{k}", k) for k in FIXED] + [("auto", K_MAX)] + \
        ([("auto_line", K_MAX)] if args.line_arm else [])
    rows, auto_recs, identical, divergences = [], [], {}, []
    i_round = 0
    for w, prompts in sets.items():
        for p in prompts:
            ids = eng.tokenize(p.text)
            outs: dict[str, list] = {}
            arm_list = arms + ([(f"peer{k}", k) for k in peer_ks] if (w == "edit" and peer) else [])
            for r in range(args.rounds + 1):  # round 0: warm-up, not recorded
                for name, k in order.arm_order(arm_list, i_round, seed=SEED):
                    if name.startswith("peer"):
                        peer[1].num_pred_tokens = k
                        rows.append({"workload": w, "prompt": p.id, "round": r, "arm": name,
                                     "decode_tok_s": peer_run(peer[0], ids, n), "e2e_tok_s": None})
                        continue
                    if name == "auto":
                        recs = run(eng, ids, drafter=auto_drafter, policy=pol, max_tokens=n)
                        if r > 0:
                            auto_recs.append((w, recs))
                    elif name == "auto_line":
                        recs = run(eng, ids, drafter=line_drafter, policy=line_pol, max_tokens=n)
                    else:
                        recs = run(eng, ids, drafter=NgramDrafter() if k else None, k=k, max_tokens=n)
                    s = summarize(recs)
                    outs.setdefault(name, []).append(recs)
                    rows.append({"workload": w, "prompt": p.id, "round": r, "arm": name, "decode_tok_s":
                                 s.decode_tok_s, "e2e_tok_s": s.e2e_tok_s, "acceptance": s.acceptance,
                                 "mean_j": float(np.mean([x.policy_j for x in recs[1:]])) if name.startswith("auto")
                                 else k})
                i_round += 1
                log(f"{w} {p.id} round {r}/{args.rounds}")
            found = explain(eng, ids, outs, identical, workload=w, prompt=p.id)
            for d in found:
                log(f"  {d['arm']} round {d['round']}: differs from plain at token {d.get('index')} "
                    f"(plain gap {d.get('plain_gap', float('nan')):.3f} logits, oracle violations "
                    f"{d['oracle_violations']}): {'near-tie' if d['lossless'] else 'NOT LOSSLESS'}")
            divergences += found
    df = pd.DataFrame(rows)
    warm = df[df["round"] > 0]

    def pairs(w, arm, base, value):
        a = warm[(warm.workload == w) & (warm.arm == arm)].set_index(["prompt", "round"])[value]
        b = warm[(warm.workload == w) & (warm.arm == base)].set_index(["prompt", "round"])[value]
        j = pd.concat([a.rename("a"), b.rename("b")], axis=1).dropna()
        return [{"prompt": pr, "round": rd, "ratio": x.a / x.b} for (pr, rd), x in j.iterrows()]

    per_workload = {}
    for w in sets:
        ests = {a: estimate(pairs(w, a, "plain", "e2e_tok_s")) for a, _ in arms if a != "plain"}
        vs_plain = {a: _est_dict(e) for a, e in ests.items()}
        best = max((f"k{k}" for k in FIXED), key=lambda a: vs_plain[a]["ratio"])
        g = warm[warm.workload == w]
        out = {"vs_plain_e2e": vs_plain, "best_fixed": best, "aa_problem": decide.aa_problem(ests["aa"]),
               "auto_vs_best_fixed_e2e": est(pairs(w, "auto", best, "e2e_tok_s")),
               "median_tok_s": g.groupby("arm")["e2e_tok_s"].median().dropna().to_dict(),
               "auto_mean_j": float(g[g.arm == "auto"]["mean_j"].mean()),
               **({"auto_vs_auto_line_e2e": est(pairs(w, "auto", "auto_line", "e2e_tok_s")),
                   "auto_line_mean_j": float(g[g.arm == "auto_line"]["mean_j"].mean())} if args.line_arm else {}),
               "acceptance": g.groupby("arm")["acceptance"].median().dropna().to_dict()}
        if w == "edit" and peer:
            med = g[g.arm.str.startswith("peer")].groupby("arm")["decode_tok_s"].median()
            best_peer = med.idxmax()
            out["peer_decode_tok_s"] = med.to_dict()
            out["best_peer"] = best_peer
            out["auto_vs_best_peer_decode"] = est(pairs(w, "auto", best_peer, "decode_tok_s"))
            out["best_fixed_vs_best_peer_decode"] = est(pairs(w, best, best_peer, "decode_tok_s"))
        per_workload[w] = out
        log(f"{w}: auto vs plain {said(vs_plain['auto'])}; vs {best} {said(out['auto_vs_best_fixed_e2e'])}; "
            f"A/A {said(vs_plain['aa'])}" + (f" ({out['aa_problem']}: these verdicts are unreliable)"
                                             if out["aa_problem"] else ""))

    def everywhere(arm, base):  # every workload's prompts together
        return est([x for w in sets for x in pairs(w, arm, base, "e2e_tok_s")])

    pooled = {"aa_vs_plain_e2e": everywhere("aa", "plain"), "auto_vs_plain_e2e": everywhere("auto", "plain")}
    log(f"all workloads: auto vs plain {said(pooled['auto_vs_plain_e2e'])}; A/A {said(pooled['aa_vs_plain_e2e'])}")
    if args.line_arm:  # every workload's prompts together: the pricing's effect over the whole traffic
        pooled["auto_vs_auto_line_e2e"] = everywhere("auto", "auto_line")
        log(f"auto (each m at its median) vs auto_line (the fitted line), all workloads: "
            f"{said(pooled['auto_vs_auto_line_e2e'])}")
    samples = calibration.samples([r for _, rs in auto_recs for r in rs], drafter="ngram")
    cal = calibration.table(samples, by=["drafter"])
    chosen = pd.Series([x.policy_j for _, rs in auto_recs for x in rs[1:]]).value_counts().sort_index()
    res = {
        "benchmark": "priced draft length policy (k: auto) vs plain, best fixed k and LlamaPromptLookupDecoding",
        "held_out": {w: [p.id for p in ps] for w, ps in sets.items()},
        "held_out_rule": f"prompts after the default recipe's first {recipe.prompts_per_workload} per workload, "
                         f"seeded permutation default_rng([{SEED}, workload index]), set {args.set} of "
                         f"{args.per_workload}",
        "rounds": args.rounds, "max_tokens": n, "metric": "e2e tok/s (TTLT) for vs plain/fixed; decode tok/s vs peer",
        "verify_fit": {"H_ms": vm.H, "V_ms": [float(vm.V(m)) for m in range(1, K_MAX + 2)],
                       "V_line_ms": [float(vm.fitted(m)) for m in range(1, K_MAX + 2)],
                       "source": f"measured at the start of this run ({args.verify_rounds} rounds, KV depth 200)"},
        "per_workload": per_workload,
        "pooled": pooled,
        "auto_j_histogram": {int(k): int(v) for k, v in chosen.items()},
        "calibration": cal.to_dict(orient="records"),
        "calibration_verdict": calibration.verdict(cal),
        "greedy_outputs_equal_plain": identical,
        "lossless": {a: not any(d["arm"] == a and not d["lossless"] for d in divergences) for a in identical},
        "divergences": divergences,
        "policy": {**pol.describe(), "learned": pol.table(), "recalibration": pol.recalibration()},
        "provenance": fingerprint.collect(engine=eng),
    }
    print(json.dumps(res, default=float))


def at_concurrency(args, sets: dict, art, vm, recipe) -> dict:
    """The same comparison at c = args.c streams (module docstring)."""
    from labkit.analysis import concurrency as ctable
    from labkit.measure import concurrency as conc

    c, n, ks = args.c, args.max_tokens, [0, *FIXED]
    per_workload, pooled = {}, {}
    for w, prompts in sets.items():
        probe = LlamaCppEngine(art.path, n_ctx=2048, n_threads=args.threads, artifact=art.describe())
        ids = [probe.tokenize(p.text) for p in prompts]
        probe.close()
        per = conc.n_ctx_per_seq(ids, max_tokens=n, ks=[K_MAX], n_ctx=4096)
        eng = LlamaCppEngine(art.path, n_ctx=per * c, n_threads=args.threads, n_seq_max=c, kv_unified=True,
                             artifact=art.describe())
        res = conc.bench_concurrency(
            eng, ids, cs=[c], ks=ks, make_drafter=NgramDrafter, runs=args.rounds, max_tokens=n, seed=SEED,
            control=True, progress=lambda m, w=w: log(f"{w}: {m}"),
            policy=("priced", lambda: policies.make("priced", k_max=K_MAX, drafter=NgramDrafter(), verify=vm), K_MAX))
        eng.close()
        df = ctable.table(res)
        rows = {("auto" if "+" in str(r["drafter"]) else "aa" if r["drafter"] == decide.AA else f"k{r['k']}"): r
                for r in df.to_dict("records")}
        fixed = {a: decide.estimate(ctable.round_pairs(rows[a], rows["k0"])) for a in (f"k{k}" for k in FIXED)}
        best = max(fixed, key=lambda a: fixed[a].ratio or 0.0)
        vs = {a: decide.estimate(ctable.round_pairs(rows[a], rows["k0"])) for a in ("aa", "auto")} | fixed
        auto_best = decide.estimate(ctable.round_pairs(rows["auto"], rows[best]))
        for a in ("aa", "auto", best):
            pooled.setdefault(a if a != best else "best_fixed", []).append(
                ctable.round_pairs(rows[a], rows["k0"]).assign(prompt=w))
        pooled.setdefault("auto_vs_best_fixed", []).append(ctable.round_pairs(rows["auto"], rows[best]).assign(prompt=w))
        pol_row = rows["auto"]
        per_workload[w] = {
            "vs_plain_aggregate": {a: _est_dict(e) for a, e in vs.items()}, "best_fixed": best,
            "auto_vs_best_fixed_aggregate": _est_dict(auto_best),
            "median_agg_tok_s": {a: r["agg_tok_s"] for a, r in rows.items()},
            "lossless": {a: r["lossless"] for a, r in rows.items()},
            "auto_j_histogram": next(r["policy_j"] for r in res["rows"] if "+" in str(r["drafter"])),
            "auto_acceptance": pol_row["acceptance"],
        }
        log(f"{w} at c={c}: auto vs plain {vs['auto'].ci_text()} {vs['auto'].verdict}; vs {best} "
            f"{auto_best.ci_text()}; A/A {vs['aa'].ci_text()}")
    return {
        "benchmark": f"priced draft length policy (k: auto) vs plain and the best fixed k at c = {c} streams",
        "held_out": {w: [p.id for p in ps] for w, ps in sets.items()},
        "held_out_rule": f"as at c = 1: set {args.set} of {args.per_workload} per workload (seed {SEED})",
        "c": c, "rounds": args.rounds, "max_tokens": n, "metric": "aggregate tok/s of a round (all requests)",
        "verify_fit": {"H_ms": vm.H, "V_ms": [float(vm.V(m)) for m in range(1, K_MAX + 2)],
                       "note": "single-stream verify(m), m 1..9, also prices the shared decode's rows (extrapolated)"},
        "per_workload": per_workload,
        "pooled": {a: _est_dict(decide.estimate(pd.concat(ps, ignore_index=True))) for a, ps in pooled.items()},
        "provenance": fingerprint.collect(),
    }


def said(d: dict) -> str:
    return f"{d['line']}, {d['verdict']}"


def _est_dict(e) -> dict:
    return {"ratio": e.ratio, "lo": e.lo, "hi": e.hi, "verdict": e.verdict, "n_prompts": e.n_prompts,
            "line": e.ci_text()}


if __name__ == "__main__":
    main()
