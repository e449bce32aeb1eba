"""Verdicts as people read them: one line each, the A/A control's tags, the forest table.

``analysis.decide`` computes; this module words and tabulates what it computed, for the
notebooks, the run tags and the worksheet. Every line carries the basis of its number
(end-to-end or decode-only) so two numbers for one arm never read as a contradiction.
"""

from __future__ import annotations

import pandas as pd

from labkit.analysis import decide
from labkit.analysis.protocol import step_line

AA_LABEL = "A/A control (plain vs plain)"


def steps_text(steps: pd.DataFrame) -> str:
    """The protocol-steps table as one line per step (A/A first), with why it stopped."""
    out = []
    for s in steps.to_dict("records"):
        if s["drafter"] == decide.AA:
            est = _from_row(s)
            out.append(f"{AA_LABEL}: {est.ci_text()} e2e, {est.verdict}"
                       + ("" if s.get("passed") else " -- box noise: verdicts below are unreliable"))
            continue
        line = step_line(s)
        out.append(line + ("" if s.get("passed") else f"  [stop: {_first_reason(s.get('stop_reason'))}]"))
    return "\n".join(out)


def _first_reason(reason) -> str:
    if not reason:
        return ""
    r = str(reason).split("; ")[0]
    return r.split(": ")[0] if ": " in r else r


def _from_row(s: dict) -> decide.Estimate:
    return decide.Estimate(ratio=s.get("e2e_speedup"), lo=s.get("e2e_lo"), hi=s.get("e2e_hi"),
                           verdict=s.get("verdict"), confidence=s.get("confidence") or decide.DEFAULT_CONFIDENCE,
                           level=s.get("ci_level") or decide.DEFAULT_CONFIDENCE, margin=decide.DEFAULT_MARGIN,
                           n_prompts=int(s.get("prompts") or 0), n_pairs=int(s.get("pairs") or 0))


def aa_tags(rows: pd.DataFrame, *, temperature: float, margin: float = decide.DEFAULT_MARGIN,
            confidence: float = decide.DEFAULT_CONFIDENCE, prefix: str = "aa") -> dict:
    """Run tags of the A/A control: ``aa.verdict``, ``aa.reliable`` ("true"/"false": the run's
    verdicts are trustworthy only when plain vs plain reads no measurable difference within
    ±``decide.AA_NOISE_MARGINS`` margins), ``aa.ci``, ``aa.line`` and, when unreliable,
    ``aa.problem``; empty when the rows have no A/A arm."""
    est = decide.aa_control(rows, temperature=temperature, margin=margin, confidence=confidence)
    if est is None:
        return {}
    ok = decide.aa_reliable(est)
    return {f"{prefix}.verdict": est.verdict, f"{prefix}.reliable": str(ok).lower(),
            f"{prefix}.ci": f"{est.ratio:.3f} [{est.lo:.3f}, {est.hi:.3f}]" if est.ratio else "",
            f"{prefix}.line": est.line(AA_LABEL) + ("" if ok else " -- box noise: this run's verdicts are unreliable"),
            **({} if ok else {f"{prefix}.problem": decide.aa_problem(est)})}


def forest_table(rows: pd.DataFrame, *, margin: float = decide.DEFAULT_MARGIN,
                 confidence: float = decide.DEFAULT_CONFIDENCE, temperature: float = 0.0,
                 value: str = "e2e_tok_s") -> pd.DataFrame:
    """One row per (drafter, k) and workload (plus "all", pooled), end-to-end speedup with
    its CI and verdict; the A/A control first. The data of the forest figure."""
    r = rows[rows["temperature"] == temperature] if "temperature" in rows else rows
    out = []
    aa = decide.aa_control(r, temperature=None, margin=margin, confidence=confidence, value=value)
    if aa is not None:
        out.append(_forest_row("A/A", 0, "all", aa, value))
    arms = (r[r["k"] > 0][["drafter", "k"]].drop_duplicates().sort_values(["drafter", "k"]).itertuples(index=False))
    for d, k in arms:
        ests = decide.compare(r, arm={"drafter": d, "k": int(k)}, value=value, temperature=None, by_workload=True,
                              margin=margin, confidence=confidence)
        for wl, est in ests.items():
            out.append(_forest_row(d, int(k), wl, est, value))
    return pd.DataFrame(out)


def _forest_row(drafter, k, workload, est: decide.Estimate, value: str) -> dict:
    label = "A/A (plain vs plain)" if drafter == "A/A" else f"{drafter} k={k} · {workload}"
    return {"label": label, "drafter": drafter, "k": k, "workload": workload, "ratio": est.ratio, "lo": est.lo,
            "hi": est.hi, "verdict": est.verdict, "prompts": est.n_prompts, "pairs": est.n_pairs,
            "basis": "end-to-end" if value == "e2e_tok_s" else "decode-only", "confidence": est.confidence}


def policy_table(rows: pd.DataFrame, *, temperature: float = 0.0, margin: float = decide.DEFAULT_MARGIN,
                 confidence: float = decide.DEFAULT_CONFIDENCE) -> pd.DataFrame:
    """Each policy arm (``k: auto``; rows with a ``policy``) against plain: end-to-end and
    decode-only paired ratios with their CI and verdict, and acceptance, pooled over prompts."""
    if "policy" not in rows.columns:
        return pd.DataFrame(columns=["drafter", "policy", "k_max", "e2e", "e2e_lo", "e2e_hi", "verdict",
                                     "decode", "decode_lo", "decode_hi", "decode_verdict", "acceptance", "line",
                                     "j_histogram", "drafted_share", "spec_draft_n_max", "spec_draft_p_min"])
    out = []
    warm = rows[~rows["cold"].astype(bool)]
    for (name, pol, kmax), g in warm[warm["policy"].notna()].groupby(["drafter", "policy", "k"]):
        arm = {"drafter": name, "k": int(kmax)}
        e2e = decide.estimate(decide.paired(warm, arm=arm, value="e2e_tok_s", temperature=temperature),
                              margin=margin, confidence=confidence)
        dec = decide.estimate(decide.paired(warm, arm=arm, value="decode_tok_s", temperature=temperature),
                              margin=margin, confidence=confidence)
        acc = g["accepted"].sum() / g["drafted"].sum() if g["drafted"].sum() else None
        did = _policy_did(g)
        out.append({**did, "drafter": name, "policy": pol, "k_max": int(kmax), "e2e": e2e.ratio, "e2e_lo": e2e.lo,
                    "e2e_hi": e2e.hi, "verdict": e2e.verdict, "decode": dec.ratio, "decode_lo": dec.lo,
                    "decode_hi": dec.hi, "decode_verdict": dec.verdict, "acceptance": acc,
                    "line": e2e.line(f"{name} (k chosen per step, up to {int(kmax)}) end-to-end", acceptance=acc)})
    return pd.DataFrame(out)


def _policy_did(g: pd.DataFrame) -> dict:
    """What the policy chose over these rows (``calibration.policy_summary``): the j histogram,
    the share of steps that drafted, and the closest fixed llama-server flags."""
    from labkit.analysis.calibration import policy_summary

    if "policy_js" not in g.columns:
        return {"j_histogram": None, "drafted_share": None, "spec_draft_n_max": None, "spec_draft_p_min": None}
    recs = []
    for js, preds in zip(g["policy_js"], g.get("policy_preds", [None] * len(g)), strict=True):
        js = list(js) if js is not None and not isinstance(js, float) else []
        if js:  # the drafted positions' predictions ride on the row's first step
            p = list(preds) if preds is not None and not isinstance(preds, float) else []
            recs += [{"policy_j": js[0], "policy_pred": p}] + [{"policy_j": j} for j in js[1:]]
    s = policy_summary(recs)
    return {"j_histogram": s.get("j_histogram"), "drafted_share": s.get("drafted_share"),
            "spec_draft_n_max": s.get("spec_draft_n_max"), "spec_draft_p_min": s.get("spec_draft_p_min")}


def llama_server_flags(table: pd.DataFrame) -> str | None:
    """The fixed llama-server flags closest to what the policy did (it cannot take the policy
    itself), with the policy's own measured result beside them."""
    t = table[table["spec_draft_n_max"].notna()] if "spec_draft_n_max" in table else table.iloc[:0]
    if t.empty:
        return None
    r = t.iloc[0]
    n = int(r["spec_draft_n_max"])
    if str(r["drafter"]).startswith("ngram"):
        # llama-server's n-gram lookup drafts its m-gram size; --spec-draft-n-max/p-min do not bound it
        flags = f"--spec-type ngram-simple --spec-ngram-simple-size-m {n}"
    else:
        p_min = f" --spec-draft-p-min {r['spec_draft_p_min']}" if r["spec_draft_p_min"] is not None else ""
        flags = f"--spec-draft-n-max {n}{p_min}"
    return (f"{flags} (closest to {r['drafter']}: it drafted on "
            f"{r['drafted_share']:.0%} of steps; measured {r['e2e']:.2f}× end-to-end, 95% CI "
            f"{r['e2e_lo']:.2f}–{r['e2e_hi']:.2f}, {r['verdict']})")
