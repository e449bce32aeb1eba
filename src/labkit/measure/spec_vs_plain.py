"""Speculative vs plain generation of one prompt: interleaved pairs (the recipe's policy),
the cold pair reported apart, speedup from the warm pairs, acceptance and the lossless check.

The verdict is the paired ratio of the warm pairs with its interval (``analysis.decide``),
decode-only (prefill left out: the drafter cannot change it) and end-to-end beside it. One
prompt: the interval is over its rounds, a claim about that prompt only.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import pandas as pd

from labkit.analysis import decide
from labkit.analysis.lossless import DEFAULT_NEAR_TIE, divergence_report
from labkit.analysis.stats import spread, summarize, tokens_from
from labkit.decoding.gate import AcceptanceGate
from labkit.decoding.loop import StepRecord, run
from labkit.measure import order
from labkit.measure.verify_cost import Progress


def _arm(records: list[list[StepRecord]]) -> dict:
    sums = [summarize(r) for r in records]
    keys = ("decode_tok_s", "e2e_tok_s", "ttft_ms", "ttlt_ms", "tokens")
    return {k: spread([getattr(s, k) for s in sums]) for k in keys}


def bench_spec(
    engine,
    prompt: Sequence[int],
    *,
    drafter=None,
    k: int = 3,
    runs: int = 3,
    max_tokens: int = 128,
    temperature: float = 0.0,
    seed: int = 0,
    make_gate: Callable[[], AcceptanceGate | None] = lambda: None,
    near_tie: float = DEFAULT_NEAR_TIE,
    keep_records: bool = False,
    interleave: str = order.DEFAULT_POLICY,
    progress: Progress = None,
    policy=None,
    margin: float = decide.DEFAULT_MARGIN,
    confidence: float = decide.DEFAULT_CONFIDENCE,
) -> dict:
    """Plain (k = 0) vs speculative generation of the same prompt, ``runs`` interleaved pairs.

    The first pair is the cold run (first after load) and is reported apart; speedup is
    the ratio of median decode tok/s of the warm runs, with the range of per-pair ratios.
    ``policy`` (``decoding.policy``): the speculative arm chooses each step's draft length
    with it (``k`` is then its k_max; it learns across the runs, as it would in service).
    ``margin`` / ``confidence``: the verdict's band and level (the recipe's decision_*).
    """
    common = dict(max_tokens=max_tokens, temperature=temperature)
    cold_base = run(engine, prompt, seed=seed, **common)
    cold_spec = run(engine, prompt, drafter=drafter, k=k, gate=make_gate(), seed=seed, policy=policy, **common)
    base_runs, spec_runs = [], []
    for r in range(runs):
        # sampled runs use a different seed per run, the same for both arms
        s = seed + 1 + r if temperature > 0 else seed
        for arm in order.arm_order(("plain", "spec"), r, policy=interleave, seed=seed):
            if arm == "plain":
                base_runs.append(run(engine, prompt, seed=s, **common))
            else:
                spec_runs.append(run(engine, prompt, drafter=drafter, k=k, gate=make_gate(), seed=s, policy=policy,
                                     **common))
        if progress:
            progress(f"spec k={k}: pair {r + 1}/{runs}")
    base, spec = _arm(base_runs), _arm(spec_runs)
    ratios = [
        summarize(s).decode_tok_s / summarize(b).decode_tok_s
        for b, s in zip(base_runs, spec_runs, strict=True)
    ]
    e2e = [summarize(s).e2e_tok_s / summarize(b).e2e_tok_s for b, s in zip(base_runs, spec_runs, strict=True)]
    name = "auto" if policy is not None else f"k={k}"
    pooled = summarize([rec for recs in spec_runs for rec in recs], k_max=k)
    out = {
        "kind": "spec",
        "k": k,
        "runs": runs,
        "max_tokens": max_tokens,
        "temperature": temperature,
        "interleave": order.describe(interleave, seed),
        "prompt_tokens": len(prompt),
        "drafter": drafter.describe() if drafter is not None else None,
        "baseline": base,
        "speculative": spec,
        "speedup": (spec["decode_tok_s"]["median"] / base["decode_tok_s"]["median"]),
        "speedup_pairs": spread(ratios),
        # the verdict: paired ratio, its CI and one of three words (decode-only; end-to-end beside it)
        "decision": paired_ratio(ratios, unit="decode-only", name=name, margin=margin, confidence=confidence),
        "decision_e2e": paired_ratio(e2e, unit="end-to-end", name=name, margin=margin, confidence=confidence),
        "cold": {"baseline": summarize(cold_base).to_dict(), "speculative": summarize(cold_spec).to_dict()},
        "acceptance": pooled.acceptance,
        "acceptance_tested": pooled.acceptance_tested,
        "mean_accepted": pooled.mean_accepted,
        "tokens_per_step": pooled.tokens_per_step,
        "accept_by_pos": pooled.accept_by_pos,
        "accept_cond_by_pos": pooled.accept_cond_by_pos,
        "rejected_share": pooled.rejected_share,
        "draft_ms_per_step": pooled.draft_ms / max(1, pooled.steps),
        "verify_ms_per_step": pooled.verify_ms / max(1, pooled.steps),
        "gate_events": [ev for recs in spec_runs for ev in summarize(recs).gate_events],
        "repetition": summarize(base_runs[0]).repetition,
    }
    if temperature == 0:
        ref = tokens_from(base_runs[0])
        reports = [divergence_report(engine, prompt, base_runs[0], s, near_tie=near_tie) for s in spec_runs]
        base_same = all(tokens_from(b) == ref for b in base_runs)
        out["lossless"] = all(r["lossless"] for r in reports) and base_same
        out["identical"] = all(r["identical"] for r in reports)
        out["divergences"] = [r["divergence"] for r in reports if r["divergence"]]
    else:
        out["lossless"] = None  # sampled: checked statistically (tests), not per run
    if keep_records:
        out["records"] = {
            "baseline": [[r.to_dict() for r in recs] for recs in base_runs],
            "speculative": [[r.to_dict() for r in recs] for recs in spec_runs],
        }
    return out


def paired_ratio(ratios: Sequence[float], *, unit: str, name: str, margin: float = decide.DEFAULT_MARGIN,
                 confidence: float = decide.DEFAULT_CONFIDENCE) -> dict:
    """The warm pairs' ratios (round by round, one prompt) as ``decide.estimate`` judges them,
    with the unit and a line a person reads: ``k=3 decode-only: 1.05× (95% CI 0.98–1.12), …``."""
    est = decide.estimate(pd.DataFrame({"prompt": "prompt", "round": range(len(ratios)), "ratio": list(ratios)}),
                          margin=margin, confidence=confidence)
    line = est.line(f"{name} {unit}") + f"; {est.n_pairs} pair{'s' if est.n_pairs != 1 else ''}"
    return {**est.to_dict(), "unit": unit, "line": line}
