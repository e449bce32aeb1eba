"""The worksheet's arithmetic and its decision words, on logged tables (no store access).

Words follow the chapter. For speculation: **keep** (the candidate n_max wins and is
not at the edge of what was tried), **widen** (it wins at the largest n_max tried: try
longer drafts), **narrow** (shorten drafts: a shorter n_max wins where the candidate
loses, or the configured n_max is longer than the winner), **disable** (nothing beats
plain decoding). For the candidate itself: **keep** or **reject** (it must win end to
end, keep greedy output identical, and keep the tool suite within its tolerance).
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from labkit.analysis import decide


def _warm(rows: pd.DataFrame, drafter: str | None, k: int, temperature: float = 0.0) -> pd.DataFrame:
    r = rows[(~rows["cold"].astype(bool)) & (rows["temperature"] == temperature) & (rows["k"] == k)]
    return r if k == 0 else r[r["drafter"] == drafter]


def run_tok_s(rows: pd.DataFrame, drafter: str | None, k: int) -> dict | None:
    """Warm greedy decode tok/s per run (tokens and time pooled over the prompts of one run
    index), as median and range over the runs."""
    r = _warm(rows, drafter, k)
    if r.empty:
        return None
    per = r.groupby("run").apply(lambda g: 1e3 * g["decode_tokens"].sum() / g["decode_ms"].sum(),
                                 include_groups=False)
    return {"median": float(per.median()), "min": float(per.min()), "max": float(per.max()), "runs": len(per)}


def paired_ratio(rows: pd.DataFrame, drafter: str, k: int, col: str, *, margin: float = decide.DEFAULT_MARGIN,
                 confidence: float = decide.DEFAULT_CONFIDENCE) -> dict | None:
    """spec/plain ``col`` over runs paired by (prompt, run): the geometric mean with its CI
    and verdict (``analysis.decide``), and the pairs' range."""
    pairs = decide.paired(rows, arm={"drafter": drafter, "k": k}, value=col)
    if pairs.empty:
        return None
    est = decide.estimate(pairs, margin=margin, confidence=confidence)
    return {"ratio": est.ratio, "lo": est.lo, "hi": est.hi, "verdict": est.verdict, "text": est.ci_text(),
            "min": float(pairs["ratio"].min()), "max": float(pairs["ratio"].max()), "pairs": len(pairs)}


def accept_length(rows: pd.DataFrame, drafter: str, k: int) -> dict | None:
    r = _warm(rows, drafter, k)
    if r.empty or not r["steps"].sum():
        return None
    spec = r["spec_steps"].sum()
    return {"tokens_per_step": float(r["decode_tokens"].sum() / r["steps"].sum()),
            "mean_accepted": float(r["accepted"].sum() / spec) if spec else None,
            "acceptance": float(r["accepted"].sum() / r["drafted"].sum()) if r["drafted"].sum() else None}


def _first_token(r: pd.DataFrame) -> float | None:
    reach = sum(int(x[0]) for x in r["drafts_reaching_pos"] if x is not None and len(x))
    return sum(int(x[0]) for x in r["acc_pos"] if x is not None and len(x)) / reach if reach else None


def _pct(x) -> str:
    return "-" if x is None or pd.isna(x) else f"{x:.0%}"


def steps_text(steps: pd.DataFrame | None, rows: pd.DataFrame | None, drafter: str, stopped: str | None) -> str:
    """Every n_max tried, one short clause each: its end-to-end verdict and acceptance (the
    full stop reasons are in the protocol-steps table, one ``labkit show`` away)."""
    if steps is not None and not steps.empty:
        parts = []
        for s in steps.to_dict("records"):
            if s["drafter"] == decide.AA:
                parts.insert(0, f"A/A {s['verdict']}" + ("" if s.get("passed") else " (box noise!)"))
                continue
            if s.get("measured", True) is False or pd.isna(s.get("e2e_speedup")):  # decided by the replay
                if pd.notna(s.get("e2e_speedup")) and pd.notna(s.get("e2e_lo")):
                    parts.append(f"{s['drafter']} n_max={s['k']}: {s['e2e_speedup']:.2f}× [{s['e2e_lo']:.2f}–"
                                 f"{s['e2e_hi']:.2f}] {_short(s['verdict'])} (replay prediction)")
                else:
                    parts.append(f"{s['drafter']} n_max={s['k']}: not measured (replay)")
                continue
            if s.get("e2e_lo") is not None and pd.notna(s.get("e2e_lo")):
                # a step's interval is at the level its corrections left (looks, candidates): say so
                lvl = s.get("ci_level")
                lvl = f", {lvl:.1%} CI" if lvl is not None and pd.notna(lvl) and abs(lvl - (s.get("confidence") or 0.95)) > 1e-9 else ""
                parts.append(f"{s['drafter']} n_max={s['k']}: {s['e2e_speedup']:.2f}× [{s['e2e_lo']:.2f}–"
                             f"{s['e2e_hi']:.2f}{lvl}] {_short(s['verdict'])}, acc {_pct(s['acceptance'])}")
            else:  # logged before verdicts had CIs
                parts.append(f"{s['drafter']} n_max={s['k']}: {s['e2e_speedup']:.2f}×, acc {_pct(s['acceptance'])}"
                             + ("" if s.get("passed") else " (stop)"))
        return "; ".join(parts)
    if rows is None:
        return ""
    parts = []
    for k in sorted(int(x) for x in rows["k"].unique() if x > 0):
        r = _warm(rows, drafter, k)
        if r.empty:
            continue
        acc = r["accepted"].sum() / r["drafted"].sum() if r["drafted"].sum() else None
        parts.append(f"n_max={k}: {_pct(acc)} (first token {_pct(_first_token(r))})")
    return (f"{drafter} " + ", ".join(parts) + ". Full grid, no stepwise stop (no protocol-steps table)"
            if parts else "")


def _short(verdict: str) -> str:
    return "no diff." if verdict == decide.NO_DIFF else verdict


def candidate_verdict(*, e2e: dict | None, decode: float | None, tool_ok: bool | None,
                      lossless: bool | None, concurrency: bool | None = None,
                      concurrency_loss: str | None = None) -> tuple[str, list[str]]:
    """keep or reject, with every reason (a missing input makes a keep provisional). A loss
    at the production concurrency (``concurrency_loss``, 07's verdict in words) does not turn
    a keep into a reject on its own, since the owner weighs it, but the keep carries it."""
    why, provisional = [], []
    if e2e is not None and e2e.get("verdict"):
        if e2e["verdict"] == decide.LOSES:
            why.append(f"end-to-end {e2e['text']} loses")
        elif e2e["verdict"] != decide.WINS:
            why.append(f"end-to-end {e2e['text']}: no measurable difference from plain, so the simpler option")
    elif decode is None:
        provisional.append("no speedup measured")
    elif decode <= 1.0:
        why.append(f"decode-only speedup {decode:.2f}× does not beat plain")
    if tool_ok is False:
        why.append("the tool suite falls outside its tolerance")
    elif tool_ok is None:
        provisional.append("no tool-suite run at the candidate")
    if lossless is False:
        why.append("greedy output differs from plain decoding")
    if concurrency is False:
        provisional.append("production concurrency not re-benched")
    if why:
        return "reject", why
    caveat = [f"but at the production concurrency: {concurrency_loss}"] if concurrency_loss else []
    return "keep", ([f"provisional: {'; '.join(provisional)}"] if provisional else []) + caveat


def speculation_words(cells: pd.DataFrame, cand: dict, *, steps: pd.DataFrame | None = None,
                      stopped: str | None = None, configured: int | None = None,
                      e2e: dict | None = None) -> dict:
    """keep / widen / narrow (shorten drafts) / disable for the candidate's drafter (greedy).

    Every word goes through a verdict: ``e2e`` (``paired_ratio`` at the candidate, pooled over
    workloads) decides whether speculation pays at all; per workload, a cell's own verdict
    (``sweep_tables.cell_table``) decides where it loses and where a shorter draft wins. Cells
    logged before verdicts had CIs fall back to their median against 1.00, and say so."""
    g = cells[(cells["temperature"] == 0) & (cells["drafter"] == cand["drafter"]) & (cells["k"] > 0)]
    if g.empty:
        return {"word": "disable", "text": f"disable: no speculative cell for {cand['drafter']}"}
    gm = g.groupby("k")["speedup"].apply(lambda s: float(np.exp(np.log(s).mean())))
    k = cand["k"] if cand["k"] in gm.index else int(gm.idxmax())
    with_verdicts = "verdict" in g.columns and g["verdict"].notna().any()
    if e2e is not None and e2e.get("verdict"):
        if e2e["verdict"] != decide.WINS:
            return {"word": "disable", "text": f"disable: {cand['drafter']} n_max={k} end-to-end {e2e['text']}, "
                                               f"{e2e['verdict']} (the simpler option)"}
        pooled = e2e["text"]
    elif gm.max() <= 1.0:
        return {"word": "disable", "text": f"disable: no n_max of {cand['drafter']} beats plain decoding "
                                           f"(best median {gm.max():.2f}× at n_max={int(gm.idxmax())}; no CI)"}
    else:
        pooled = f"{gm[k]:.2f}× median, no CI"

    def loses(x) -> bool:
        return x["verdict"] == decide.LOSES if with_verdicts else x["speedup"] <= 1

    def wins(x) -> bool:
        return x["verdict"] == decide.WINS if with_verdicts else x["speedup"] > 1

    at_k = g[g["k"] == k]
    losers = sorted(r["workload"] for r in at_k.to_dict("records") if loses(r))
    shorter = {}
    for w in losers:
        ok = [r for r in g[(g["workload"] == w) & (g["k"] < k)].to_dict("records") if wins(r)]
        if ok:
            shorter[w] = int(max(ok, key=lambda r: r["speedup"])["k"])
    tried = int(steps["k"].max()) if steps is not None and not steps.empty else int(g["k"].max())
    if configured is not None and configured > k:
        return {"word": "narrow", "text": f"narrow (shorten drafts): the configured n_max={configured} is longer "
                                          f"than the winner n_max={k}"}
    if shorter:
        return {"word": "narrow", "text": "narrow (shorten drafts): " + ", ".join(
            f"{w} wins at n_max={s} but loses at {k}" for w, s in shorter.items())
            + (f"; disable for {', '.join(w for w in losers if w not in shorter)}"
               if len(shorter) < len(losers) else "")}
    if k >= tried and not (stopped and "loss" in stopped.lower()):
        return {"word": "widen", "text": f"widen: n_max={k} is the longest tried and still wins "
                                         f"({pooled}); measure longer drafts"}
    text = f"keep: {cand['drafter']} n_max={k} ({pooled})"
    if losers:
        text += f"; it loses on {', '.join(losers)} at every n_max (rely on the gate there)"
    return {"word": "keep", "text": text}


def dominant_term(pred: pd.DataFrame | None, drafter: str, k: int) -> str | None:
    """Which term of (D + V(k+1)) / accepted < H dominated at the candidate (greedy, pooled
    over workloads): the cost model's losing term where a cell loses, else the larger of
    D and V(k+1) - H per step where it wins."""
    if pred is None or pred.empty:
        return None
    p = pred[(pred["drafter"] == drafter) & (pred["k"] == k) & (pred["temperature"] == 0)]
    if p.empty:
        return None
    lose = p[p["losing_term"].notna()]
    if not lose.empty:  # one clause for all losing workloads; the spill label is the spill row's, not repeated
        terms = lose["losing_term"].str.split(" dominates").str[0].value_counts()
        return (f"{terms.index[0]} dominates on {', '.join(sorted(lose['workload']))}: (D "
                f"{lose['pred_D_ms'].median():.1f} + V {lose['pred_V_ms'].median():.1f} ms) / "
                f"{lose['pred_tokens_per_step'].median():.2f} tokens = {lose['pred_ms_per_token'].median():.1f} "
                f"ms/token ≥ H {lose['H_ms'].median():.1f} ms")
    D, V, H = p["pred_D_ms"].median(), p["pred_V_ms"].median(), p["H_ms"].median()
    dom = "verify V(k+1)" if V - H >= D else "draft D"
    return (f"{dom} dominates the extra cost but the step wins: (D {D:.1f} + V {V:.1f} ms) / "
            f"{p['pred_tokens_per_step'].median():.2f} tokens = {p['pred_ms_per_token'].median():.1f} ms/token "
            f"< H {H:.1f} ms")
