"""Agreement between labkit's timings and llama-bench's (``measure.crosscheck``).

Per quantity, the ratio labkit / llama-bench is paired by round (each round measured both
arms back to back), and its geometric mean gets a t interval over rounds
(``decide.estimate``). Against the tolerance (default ±10%):

- **agree**: the whole interval lies inside [1 - tol, 1 + tol];
- **disagree**: the whole interval lies outside it (a finding: shown, never hidden);
- **undetermined**: the interval straddles an edge (more rounds would say).

Only like-for-like rows are judged (labkit's m rows with one logit row vs llama-bench's
prompt batch of m, which asks for one; labkit's one-row step vs llama-bench's generated
token). labkit's verify with every logit row is listed beside them, unjudged: its excess
over the one-logit decode is the output head's cost per extra row.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from labkit.analysis import decide

AGREE, DISAGREE, UNDETERMINED = "agree", "disagree", "undetermined"


def _per_round(s: pd.DataFrame) -> pd.Series:
    return s.groupby("round")["ms"].median()


def _judge(lo: float | None, hi: float | None, tol: float) -> str:
    if lo is None or hi is None or not np.isfinite(hi):
        return UNDETERMINED
    if lo >= 1 - tol and hi <= 1 + tol:
        return AGREE
    if hi < 1 - tol or lo > 1 + tol:
        return DISAGREE
    return UNDETERMINED


def _ratio(a: pd.Series, b: pd.Series, *, confidence: float) -> decide.Estimate:
    both = pd.concat([a.rename("a"), b.rename("b")], axis=1).dropna()
    pairs = pd.DataFrame({"prompt": "x", "round": both.index, "ratio": both["a"] / both["b"]})
    return decide.estimate(pairs, margin=0.02, confidence=confidence)


def agreement(samples: pd.DataFrame, *, tolerance: float = 0.10, confidence: float = 0.95) -> pd.DataFrame:
    """One row per quantity: labkit and llama-bench medians (ms), the ratio with its CI, the
    verdict (``judged`` rows only) and, for labkit's verify, the extra ms per logit row."""
    if not 0 < tolerance < 0.5:
        raise ValueError(f"tolerance {tolerance} is outside (0, 0.5): use a fraction such as 0.10")
    lk = samples[samples["source"] == "labkit"]
    lb = samples[samples["source"] == "llama-bench"]
    out = []

    def row(quantity, m, logit_rows, a, b, judged, **extra):
        est = _ratio(a, b, confidence=confidence)
        out.append({"quantity": quantity, "m": m, "logit_rows": logit_rows,
                    "labkit_ms": float(a.median()), "llama_bench_ms": float(b.median()),
                    "ratio": est.ratio, "lo": est.lo, "hi": est.hi, "rounds": est.n_pairs,
                    "verdict": _judge(est.lo, est.hi, tolerance) if judged else None,
                    "judged": judged, "tolerance": tolerance, **extra})

    for m in sorted(lb[lb["test"] == "pp"]["m"].unique()):
        b = _per_round(lb[(lb["test"] == "pp") & (lb["m"] == m)])
        one = _per_round(lk[(lk["m"] == m) & (lk["logit_rows"] == 1)])
        if len(one):
            row(f"decode of {m} rows, 1 logit row (llama-bench pp{m})", int(m), 1, one, b, True)
        if m > 1:
            every = _per_round(lk[(lk["m"] == m) & (lk["logit_rows"] == m)])
            if len(every):
                row(f"verify({m}) as speculation runs it: {m} logit rows", int(m), int(m), every, b, False,
                    extra_ms_per_logit_row=float((every.median() - one.median()) / (m - 1)) if len(one) else None)
    tg = lb[lb["test"] == "tg"]
    h = _per_round(lk[(lk["m"] == 1) & (lk["logit_rows"] == 1)])
    if len(tg) and len(h):
        row("plain step H (llama-bench tg)", 1, 1, h, _per_round(tg), True)
    return pd.DataFrame(out)


def summary(table: pd.DataFrame) -> dict:
    """The tags: ``crosscheck.verdict`` (agree / disagree / undetermined over the judged
    rows: any disagree wins, then any undetermined) and ``crosscheck.line`` in words."""
    if table.empty:
        return {"verdict": None, "line": "no cross-check rows"}
    j = table[table["judged"]]
    tol = float(j["tolerance"].iloc[0]) if len(j) else 0.1
    bad = j[j["verdict"] == DISAGREE]
    open_ = j[j["verdict"] == UNDETERMINED]
    verdict = DISAGREE if len(bad) else (UNDETERMINED if len(open_) else AGREE)

    def at(rows) -> str:
        return ", ".join("H" if "plain step" in q else f"m={m}" for q, m in zip(rows["quantity"], rows["m"]))

    lo, hi = j["ratio"].min(), j["ratio"].max()
    line = (f"labkit vs llama-bench on one build: {verdict} within ±{tol:.0%} "
            f"(ratios {lo:.2f}–{hi:.2f}× over {len(j)} like-for-like rows)")
    if len(bad):
        line += f"; disagree at {at(bad)}"
    if len(open_):
        line += f"; undetermined at {at(open_)}"
    ex = table[table["extra_ms_per_logit_row"].notna()] if "extra_ms_per_logit_row" in table else table.iloc[:0]
    if len(ex):
        line += (f"; labkit's verify adds {ex['extra_ms_per_logit_row'].median():.2f} ms per extra logit row "
                 "(the output head; llama-bench's prompt batch computes one)")
    return {"verdict": verdict, "line": line}


def batched_agreement(conc: pd.DataFrame, bench: pd.DataFrame, *, tolerance: float = 0.10,
                      confidence: float = 0.95) -> pd.DataFrame:
    """07's plain labkit arms (aggregate decode tok/s per round, prefill left out) vs
    llama-batched-bench's speed_tg at the same c, paired by round index."""
    plain = conc[(conc["engine"] == "labkit") & (conc["k"] == 0) & (conc["drafter"] == "none")]
    out = []
    for r in plain.to_dict("records"):
        b = bench[bench["pl"] == r["c"]].set_index("round")["speed_tg"]
        runs = r.get("agg_decode_runs")
        if b.empty or runs is None or not len(runs):
            continue
        a = pd.Series(list(runs), index=range(len(runs)), dtype=float)
        est = _ratio(a, b, confidence=confidence)
        out.append({"c": int(r["c"]), "labkit_tok_s": float(a.median()), "batched_bench_tok_s": float(b.median()),
                    "ratio": est.ratio, "lo": est.lo, "hi": est.hi, "rounds": est.n_pairs,
                    "verdict": _judge(est.lo, est.hi, tolerance), "tolerance": tolerance,
                    "quantity": "plain aggregate decode tok/s (prefill left out)"})
    return pd.DataFrame(out)


def acceptance_by_position(conc: pd.DataFrame) -> pd.DataFrame:
    """Per speculative arm and draft position i (1-based): the share of draft-verifying steps
    that accepted at least i drafted tokens; labkit's from its step records, llama-server's
    from its own ``/metrics`` counters (``spec_decode_num_accepted_tokens_per_pos_total``
    over ``spec_decode_num_drafts_total``). The two engines' n-gram drafters are different
    implementations: this is a side-by-side, not a verdict."""
    out = []
    for r in conc[(conc["k"] > 0)].to_dict("records"):
        steps, per = r.get("draft_steps"), r.get("accepted_per_pos")
        if not steps or per is None or (isinstance(per, float) and np.isnan(per)):
            continue
        for i, n in enumerate(per):
            out.append({"engine": r["engine"], "c": int(r["c"]), "k": int(r["k"]), "drafter": r["drafter"],
                        "position": i + 1, "accepted": int(n), "draft_steps": int(steps), "rate": n / steps,
                        "source": "llama-server /metrics" if r["engine"] == "llama-server" else "labkit step records"})
    return pd.DataFrame(out, columns=["engine", "c", "k", "drafter", "position", "accepted", "draft_steps", "rate",
                                      "source"])


def summary_batched(table: pd.DataFrame) -> str:
    """One line: the verdict at each c, e.g. 'c=1 agree 1.02× [0.99–1.05]; c=4 disagree …'."""
    if table.empty:
        return "no batched-bench rows"
    tol = float(table["tolerance"].iloc[0])
    return (f"labkit plain vs llama-batched-bench (±{tol:.0%}): " + "; ".join(
        f"c={r['c']} {r['verdict']} {r['ratio']:.2f}× [{r['lo']:.2f}–{r['hi']:.2f}]" for r in table.to_dict("records")))
