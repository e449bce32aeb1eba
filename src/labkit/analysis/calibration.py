"""Calibration of a draft length policy: did its predicted acceptance match what happened?

The priced policy (``decoding.policy``) records, on every step where it drafted, its
predicted conditional acceptance per drafted position (``policy_pred``) beside what the
target did (``outcomes``: 1 accepted, 0 rejected, -1 not tested because an earlier
position was rejected). A prediction is checked only where it was tested, which is
exactly what it predicts: P(accept position i | positions < i accepted).

The table bins the predictions (tenths by default) and gives, per bin, the mean
prediction, the realised rate and its count. A bin with at least ``min_samples`` tested
predictions is judged: within ``tolerance`` (5 points) or not. ``verdict`` says it in one
line, naming the bins that miss and the bins too thin to judge.
"""

from __future__ import annotations

from collections.abc import Iterable

import numpy as np
import pandas as pd

DEFAULT_BINS = 10
MIN_SAMPLES = 30
TOLERANCE = 0.05


def _get(r, name):
    return r.get(name) if isinstance(r, dict) else getattr(r, name, None)


def samples(records: Iterable, **labels) -> pd.DataFrame:
    """One row per tested prediction: position, evidence bin, predicted, accepted (0/1),
    plus ``labels`` as constant columns (e.g. drafter="ngram", workload="edit")."""
    rows = []
    for r in records:
        pred = _get(r, "policy_pred")
        if not pred:
            continue
        bins = _get(r, "policy_bins") or [""] * len(pred)
        for i, (p, o) in enumerate(zip(pred, _get(r, "outcomes"), strict=False)):
            if o < 0:
                break
            rows.append({**labels, "position": i, "evidence": bins[i], "predicted": float(p), "accepted": int(o)})
    cols = [*labels, "position", "evidence", "predicted", "accepted"]
    return pd.DataFrame(rows, columns=cols)


def table(data: pd.DataFrame, *, by: Iterable[str] = (), bins: int = DEFAULT_BINS, min_samples: int = MIN_SAMPLES,
          tolerance: float = TOLERANCE) -> pd.DataFrame:
    """Predicted vs realised acceptance per prediction bin (and per ``by`` group):
    n, mean predicted, realised, gap in points, whether it has enough samples and is within tolerance."""
    by = list(by)
    cols = [*by, "bin", "bin_lo", "bin_hi", "n", "predicted", "realised", "gap_pts", "enough", "within"]
    if data.empty:
        return pd.DataFrame(columns=cols)
    d = data.copy()
    idx = np.minimum((d["predicted"].to_numpy() * bins).astype(int), bins - 1)
    d["bin_lo"], d["bin_hi"] = idx / bins, (idx + 1) / bins
    d["bin"] = [f"[{lo:.1f}, {hi:.1f})" for lo, hi in zip(d["bin_lo"], d["bin_hi"], strict=True)]
    g = d.groupby([*by, "bin", "bin_lo", "bin_hi"], sort=True)
    out = g.agg(n=("accepted", "size"), predicted=("predicted", "mean"), realised=("accepted", "mean")).reset_index()
    out["gap_pts"] = 100 * (out["realised"] - out["predicted"])
    out["enough"] = out["n"] >= min_samples
    out["within"] = out["enough"] & (out["gap_pts"].abs() <= 100 * tolerance)
    return out[cols]


def verdict(tab: pd.DataFrame, *, tolerance: float = TOLERANCE, min_samples: int = MIN_SAMPLES) -> str:
    """One line: within tolerance in every bin with enough samples, or where not."""
    if tab.empty:
        return "no tested predictions: the policy never drafted"
    judged = tab[tab["enough"]]
    thin = tab[~tab["enough"]]
    miss = judged[~judged["within"]]
    pts = f"{100 * tolerance:g} points"

    def name(r) -> str:
        extra = "".join(f"{c}={r[c]} " for c in tab.columns if c not in (
            "bin", "bin_lo", "bin_hi", "n", "predicted", "realised", "gap_pts", "enough", "within"))
        return f"{extra}{r['bin']} ({r['gap_pts']:+.1f} pts, n={r['n']})"

    if judged.empty:
        head = f"no bin has {min_samples} tested predictions yet"
    elif miss.empty:
        head = f"within {pts} in all {len(judged)} bins with >= {min_samples} samples"
    else:
        head = (f"not within {pts} in {len(miss)} of {len(judged)} bins with >= {min_samples} samples: "
                + "; ".join(name(r) for _, r in miss.iterrows()))
    if not thin.empty:
        head += f"; {len(thin)} bins too thin to judge ({int(thin['n'].sum())} samples)"
    return head


def policy_summary(records: Iterable, *, quantile: float = 0.9) -> dict:
    """What a draft length policy did over ``records`` (its steps after the prefill): the
    histogram of chosen j, the share of steps that drafted, and the fixed llama-server
    settings closest to it: ``--spec-draft-n-max`` = the smallest n that covers
    ``quantile`` of the drafting steps' j, ``--spec-draft-p-min`` = the lowest predicted acceptance the policy still
    drafted at (its 10th percentile over drafted positions: what p-min would cut)."""
    js, preds = [], []
    for r in records:
        j = _get(r, "policy_j")
        if j is None:
            continue
        js.append(int(j))
        preds += list(_get(r, "policy_pred") or [])
    if not js:
        return {"steps": 0}
    hist = {int(k): int(v) for k, v in zip(*np.unique(js, return_counts=True), strict=True)}
    drafting = [j for j in js if j > 0]
    return {
        "steps": len(js), "j_histogram": hist, "drafted_share": len(drafting) / len(js),
        "mean_j": float(np.mean(js)), "mean_j_when_drafting": float(np.mean(drafting)) if drafting else 0.0,
        "spec_draft_n_max": int(np.quantile(drafting, quantile, method="inverted_cdf")) if drafting else 0,
        "spec_draft_p_min": round(float(np.quantile(preds, 0.10)), 2) if preds else None,
    }
