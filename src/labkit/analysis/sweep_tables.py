"""The k sweep's tables, from its per-generation rows (no decoding here): cells with
medians and ranges, best k, the global default, latency, gate on/off, repetition,
acceptance by position and time lost to rejected drafts.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from labkit.analysis import decide
from labkit.analysis.stats import pos_sum


def cell_table(df: pd.DataFrame, *, margin: float = decide.DEFAULT_MARGIN,
               confidence: float = decide.DEFAULT_CONFIDENCE) -> pd.DataFrame:
    """Per (drafter, workload, k, temperature): median tok/s with range, speedup, acceptance.

    Speedup (decode-only: prefill left out) pairs each warm speculative run with the warm
    plain run of the same prompt and run index: its median and range over those pairs, and
    its geometric mean with CI and verdict (``analysis.decide``; ``speedup_gm``, ``speedup_lo``,
    ``speedup_hi``, ``verdict``). The A/A control arm is not a cell (``decide.aa_control``).
    """
    warm = decide.without_control(df[~df["cold"]])
    base = warm[warm["k"] == 0].set_index(["prompt", "temperature", "run"])["decode_tok_s"]
    out = []
    for (drafter, wl, k, temp), g in warm.groupby(["drafter", "workload", "k", "temperature"]):
        ratios = [r.decode_tok_s / base.loc[(r.prompt, r.temperature, r.run)] for r in g.itertuples()]
        est = decide.estimate(pd.DataFrame({"prompt": g["prompt"].to_numpy(), "round": g["run"].to_numpy(),
                                            "ratio": ratios}), margin=margin, confidence=confidence)
        acc = g["accepted"].sum()
        drafted = g["drafted"].sum()
        steps = g["steps"].sum()
        out.append({
            "drafter": drafter, "workload": wl, "k": k, "temperature": temp, "n": len(g),
            "tok_s": float(g["decode_tok_s"].median()), "tok_s_min": float(g["decode_tok_s"].min()),
            "tok_s_max": float(g["decode_tok_s"].max()),
            "speedup": float(np.median(ratios)), "speedup_min": float(np.min(ratios)),
            "speedup_max": float(np.max(ratios)), "speedup_gm": est.ratio, "speedup_lo": est.lo,
            "speedup_hi": est.hi, "verdict": est.verdict if k > 0 else None, "prompts": est.n_prompts,
            "acceptance": float(acc / drafted) if drafted else None,
            "tokens_per_step": float(g["decode_tokens"].sum() / steps) if steps else None,
            "mean_accepted": float(acc / g["spec_steps"].sum()) if g["spec_steps"].sum() else None,
            "draft_ms_step": float(g["draft_ms"].sum() / steps) if steps else None,
            "verify_ms_step": float(g["verify_ms"].sum() / steps) if steps else None,
            "repetition": float(g["repetition"].median()) if g["repetition"].notna().any() else None,
            "ttft_ms": float(g["ttft_ms"].median()), "ttlt_ms": float(g["ttlt_ms"].median()),
            "gate_closed": int(g["gate_closed"].sum()),
            "lossless": bool(g["lossless"].all()) if "lossless" in g and g["lossless"].notna().all() else None,
        })
    return pd.DataFrame(out)


def best_k(cells: pd.DataFrame, *, drafter: str | None = None, rows: pd.DataFrame | None = None,
           margin: float = decide.DEFAULT_MARGIN, confidence: float = decide.DEFAULT_CONFIDENCE) -> pd.DataFrame:
    """Best k per (drafter, workload, temperature): the k with the highest speedup, kept only
    when its verdict is "wins"; else k = 0 (disable: the simpler option).

    Picking the best of S k values from the same data is a selection, so the chosen k is
    judged at confidence 1 - alpha/S (Bonferroni; ``verdict`` and its ``lo``/``hi``). With
    ``rows`` (the sweep's rows) the verdict is re-estimated from the pairs; without, from the
    cell's own speedup columns (decode-only)."""
    out = []
    c = cells if drafter is None else cells[cells["drafter"].isin([drafter, "none"])]
    for (d, wl, temp), g in c[c["k"] > 0].groupby(["drafter", "workload", "temperature"]):
        key = "speedup_gm" if "speedup_gm" in g and g["speedup_gm"].notna().all() else "speedup"
        top = g.loc[g[key].idxmax()]
        est = _selected(rows, d, wl, int(top["k"]), temp, adjust=len(g), margin=margin, confidence=confidence)
        if est is not None:
            win = est.verdict == decide.WINS
        elif "verdict" in g.columns and pd.notna(top.get("verdict")):
            win = top["verdict"] == decide.WINS  # the cell's own CI (not corrected for the selection)
        else:
            win = top[key] > 1.0  # cells logged before verdicts had CIs
        out.append({"drafter": d, "workload": wl, "temperature": temp, "best_k": int(top["k"]) if win else 0,
                    "speedup": float(top[key]) if win else 1.0,
                    "best_spec_k": int(top["k"]), "best_spec_speedup": float(top[key]),
                    "lo": est.lo if est is not None else None, "hi": est.hi if est is not None else None,
                    "verdict": est.verdict if est is not None else None, "candidates": len(g),
                    "pairs": est.n_pairs if est is not None else None,
                    "acceptance": top["acceptance"]})
    return pd.DataFrame(out)


def _selected(rows, drafter, workload, k, temp, *, adjust, **kw):
    if rows is None:
        return None
    r = rows[rows["workload"] == workload]
    pairs = decide.paired(r, arm={"drafter": drafter, "k": k}, value="decode_tok_s", temperature=temp)
    return decide.estimate(pairs, adjust=adjust, **kw)


def geomean_by_k(cells: pd.DataFrame) -> pd.Series:
    """k -> geometric-mean speedup over the given cells (one drafter, one temperature)."""
    return cells.groupby("k")["speedup"].apply(lambda s: float(np.exp(np.log(s).mean())))


def global_default(cells: pd.DataFrame, *, rows: pd.DataFrame | None = None, margin: float = decide.DEFAULT_MARGIN,
                   confidence: float = decide.DEFAULT_CONFIDENCE) -> pd.DataFrame:
    """One k per drafter for all workloads: the k with the best geometric-mean speedup, kept
    when (with ``rows``) its pooled verdict, corrected for picking the best of the k tested,
    is "wins"; else k = 0."""
    out = []
    for (d, temp), g in cells[cells["k"] > 0].groupby(["drafter", "temperature"]):
        gm = geomean_by_k(g)
        k = int(gm.idxmax())
        est = None
        if rows is not None:
            pairs = decide.paired(rows, arm={"drafter": d, "k": k}, value="decode_tok_s", temperature=temp)
            est = decide.estimate(pairs, adjust=len(gm), margin=margin, confidence=confidence)
        win = est.verdict == decide.WINS if est is not None else gm.max() > 1
        out.append({"drafter": d, "temperature": temp, "k": k if win else 0,
                    "geomean_speedup": float(gm.max()), "lo": est.lo if est else None,
                    "hi": est.hi if est else None, "verdict": est.verdict if est else None,
                    "k_tested": sorted(int(x) for x in gm.index)})
    return pd.DataFrame(out)


def latency_table(rows: pd.DataFrame) -> pd.DataFrame:
    """Time to first and to last token, cold (first run) vs warm, per drafter/workload/k."""
    g = rows.groupby(["drafter", "workload", "k", "cold"]).agg(
        ttft_ms=("ttft_ms", "median"), ttft_min=("ttft_ms", "min"), ttft_max=("ttft_ms", "max"),
        ttlt_ms=("ttlt_ms", "median"), ttlt_min=("ttlt_ms", "min"), ttlt_max=("ttlt_ms", "max"),
        n=("ttft_ms", "size"))
    out = g.reset_index()
    out["run"] = np.where(out["cold"], "cold", "warm")
    return out.drop(columns="cold")


def gate_comparison(off: pd.DataFrame, on: pd.DataFrame) -> pd.DataFrame:
    """Cells at the same k with the gate off vs on: each side's speedup over its own plain arm
    (geometric mean with CI and verdict, ``cell_table``; median and range beside) and how often
    the gate fired. ``verdict_changed`` says where the gate turns one verdict into another."""
    keys = ["drafter", "workload", "k", "temperature"]
    est = [c for c in ("speedup_gm", "speedup_lo", "speedup_hi", "verdict") if c in off.columns and c in on.columns]
    a = off[off["k"] > 0][keys + ["speedup", "speedup_min", "speedup_max", *est, "acceptance"]]
    b = on[on["k"] > 0][keys + ["speedup", "speedup_min", "speedup_max", *est, "gate_closed"]]
    m = a.merge(b, on=keys, suffixes=("_gate_off", "_gate_on"))
    m["gate_fired"] = m["gate_closed"] > 0
    if "verdict" in est:
        m["verdict_changed"] = m["verdict_gate_off"] != m["verdict_gate_on"]
    return m


def repetition_table(rows: pd.DataFrame, drafter: str = "ngram") -> pd.DataFrame:
    """Acceptance beside output repetition for each warm generation of one drafter."""
    r = rows[(rows["drafter"] == drafter) & (~rows["cold"]) & (rows["k"] > 0) & rows["acceptance"].notna()]
    return r[["workload", "prompt", "temperature", "k", "repetition", "acceptance"]].reset_index(drop=True)


def position_table(rows: pd.DataFrame) -> pd.DataFrame:
    """Per (drafter, workload, k, position): conditional acceptance (accepted / tested at i) and
    vLLM's per-draft rate (accepted at i / drafts reaching i), pooled over warm greedy runs."""
    out = []
    warm = rows[(~rows["cold"]) & (rows["k"] > 0)]
    for (d, wl, k, temp), g in warm.groupby(["drafter", "workload", "k", "temperature"]):
        acc, tested, reach = (pos_sum(g[c], int(k)) for c in ("acc_pos", "tested_pos", "drafts_reaching_pos"))
        for i in range(int(k)):
            out.append({"drafter": d, "workload": wl, "k": int(k), "temperature": temp, "position": i,
                        "accepted": int(acc[i]), "tested": int(tested[i]), "drafts": int(reach[i]),
                        "accept_cond": float(acc[i] / tested[i]) if tested[i] else None,
                        "accept_per_draft": float(acc[i] / reach[i]) if reach[i] else None})
    return pd.DataFrame(out)


SEGMENTS = ("1st quarter", "2nd quarter", "3rd quarter", "4th quarter")


def policy_j_table(prow: pd.DataFrame) -> pd.DataFrame:
    """Where a draft length policy chose which j: over the warm runs of each policy arm
    (``policy_js``: the j of every step, ``policy_accepted``: its accepted tokens), per
    drafter, workload and quarter of the generation (and "all"), the share of steps at each
    j and the tokens each such step emitted (accepted + 1)."""
    cols = ["drafter", "workload", "segment", "j", "steps", "share", "tokens_per_step"]
    if prow is None or prow.empty or "policy_js" not in prow:
        return pd.DataFrame(columns=cols)
    r = prow if "cold" not in prow else prow[~prow["cold"].astype(bool)]
    seq = (list, tuple, np.ndarray)  # a logged table read back gives plain rows' cells as NaN
    steps = []
    for x in r.to_dict("records"):
        js = list(x["policy_js"]) if isinstance(x.get("policy_js"), seq) else []
        acc = x.get("policy_accepted")
        acc = list(acc) if isinstance(acc, seq) else [None] * len(js)
        for i, (j, a) in enumerate(zip(js, acc, strict=True)):
            seg = SEGMENTS[min(3, 4 * i // max(1, len(js)))]
            steps.append({"drafter": x["drafter"], "workload": x["workload"], "segment": seg, "j": int(j),
                          "tokens": None if a is None else a + 1})
    if not steps:
        return pd.DataFrame(columns=cols)
    s = pd.DataFrame(steps)
    s = pd.concat([s.assign(segment="all"), s], ignore_index=True)
    g = s.groupby(["drafter", "workload", "segment", "j"], sort=True)
    out = g.size().rename("steps").reset_index()
    out["tokens_per_step"] = g["tokens"].mean().to_numpy()
    out["share"] = out["steps"] / out.groupby(["drafter", "workload", "segment"])["steps"].transform("sum")
    order = {seg: i for i, seg in enumerate(("all", *SEGMENTS))}
    out = out.sort_values(["drafter", "workload", "segment", "j"], key=lambda c: c.map(order) if c.name == "segment"
                          else c, ignore_index=True)
    return out[cols]


def rejection_table(rows: pd.DataFrame) -> pd.DataFrame:
    """Mean accepted length and the time spent on rejected drafts, per drafter/workload/k."""
    warm = rows[(~rows["cold"]) & (rows["k"] > 0)]
    g = warm.groupby(["drafter", "workload", "k", "temperature"]).agg(
        drafted=("drafted", "sum"), accepted=("accepted", "sum"), spec_steps=("spec_steps", "sum"),
        steps=("steps", "sum"), rejected_ms=("rejected_ms", "sum"), decode_ms=("decode_ms", "sum")).reset_index()
    g["acceptance_per_drafted"] = g["accepted"] / g["drafted"].where(g["drafted"] > 0)
    g["mean_accepted_per_spec_step"] = g["accepted"] / g["spec_steps"].where(g["spec_steps"] > 0)
    g["rejected_share_of_decode"] = g["rejected_ms"] / g["decode_ms"]
    return g


def cell_metrics(cells: pd.DataFrame, *, rows: pd.DataFrame | None = None, margin: float = decide.DEFAULT_MARGIN,
                 confidence: float = decide.DEFAULT_CONFIDENCE) -> list[dict]:
    """Per-cell tok/s and speedup as metrics (step = k), with their recorded ranges, and
    the best k and its speedup per drafter and workload as scalars a runs table can sort
    by (``best/k/ngram.edit``; sampled temperatures get a ``.T0.7`` suffix). Keys are
    ``section/name`` so the MLflow UI groups their charts (provenance/metric_keys.py)."""
    out = []
    for c in cells.itertuples():
        tag = f"{c.drafter}.{c.workload}.T{c.temperature:g}"
        out.append({"name": f"tok_s/{tag}", "value": c.tok_s, "lo": c.tok_s_min, "hi": c.tok_s_max, "step": c.k})
        ci = c.k > 0 and c.speedup_lo is not None and c.speedup_lo == c.speedup_lo and np.isfinite(c.speedup_hi)
        # speedup: the geometric mean with its CI (drift compares CIs); plain's own is 1.0
        out.append({"name": f"speedup/{tag}", "value": c.speedup_gm if ci else c.speedup,
                    "lo": c.speedup_lo if ci else c.speedup_min, "hi": c.speedup_hi if ci else c.speedup_max,
                    "step": c.k})
    # the best k is a decision: chosen by the selection-corrected verdict (with ``rows``), and its
    # speedup carries that CI, so drift compares intervals, not a median against 5%
    for b in best_k(cells, rows=rows, margin=margin, confidence=confidence).itertuples():
        tag = f"{b.drafter}.{b.workload}" + ("" if b.temperature == 0 else f".T{b.temperature:g}")
        out.append({"name": f"best/k/{tag}", "value": b.best_k})
        ci = b.best_k > 0 and b.lo is not None and b.lo == b.lo and b.hi is not None and np.isfinite(b.hi)
        out.append({"name": f"best/speedup/{tag}", "value": b.speedup,
                    **({"lo": b.lo, "hi": b.hi} if ci else {})})
    return out


def rejection_metrics(rej: pd.DataFrame, k: int) -> list[dict]:
    """The share of decode time lost to rejected drafts at draft length ``k`` (greedy)."""
    sel = rej[(rej["k"] == k) & (rej["temperature"] == 0)]
    return [{"name": f"rejected_share/{r.drafter}.{r.workload}", "value": r.rejected_share_of_decode, "step": k}
            for r in sel.itertuples()]
