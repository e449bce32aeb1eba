"""Dense vs MoE verify cost on matched active parameters (SYNTHETIC models: cost only).

A dense model's extra verify row multiplies by the same weights as the first row, so
its cost is mostly compute. An MoE's extra row may route to experts no earlier row
used, and reading those experts' weights is the per-row expert term. With uniform
routing of top-u of E experts, m rows touch E * (1 - (1 - u/E)^m) distinct experts
per MoE layer on average; the bytes of the experts they read relate the measured
term to memory traffic.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from labkit.analysis.costmodel import fit_verify, verify_frame
from labkit.artifacts import zoo
from labkit.engines.llamacpp import LlamaCppEngine
from labkit.measure import verify_cost

LABEL = "SYNTHETIC random weights: valid for cost only, never for acceptance"


def measure(names, *, m_values, rounds: int, kv_depth: int, threads: int | None, seed: int = 0,
            progress=None) -> pd.DataFrame:
    """verify(m) samples for each synthetic model, as one long table (model, m, ms)."""
    frames = []
    for name in names:
        art = zoo.get(name)
        with LlamaCppEngine(art.path, n_ctx=max(512, kv_depth + max(m_values) + 8), n_threads=threads,
                            artifact=art.describe()) as e:
            res = verify_cost.bench_verify(e, m_values=m_values, rounds=rounds, kv_depth=kv_depth, seed=seed,
                                     progress=progress)
        frames.append(verify_frame(res).assign(model=name, synthetic=art.synthetic))
    return pd.concat(frames, ignore_index=True)


def contrast(samples: pd.DataFrame, *, dense: str = "synthetic-dense", moe: str = "synthetic-moe") -> dict:
    """Per-row cost of each model, the expert term (MoE minus dense, with a 95% CI), and
    the expert bytes the extra rows read under uniform routing."""
    fits = {m: fit_verify(g[["m", "ms"]]) for m, g in samples.groupby("model")}
    fd, fm = fits[dense], fits[moe]
    se = lambda f: (f.b_ci[1] - f.b_ci[0]) / (2 * f.t)  # noqa: E731
    diff = fm.b - fd.b
    half = 1.96 * float(np.hypot(se(fd), se(fm)))
    made = zoo.get(moe).made
    E, u = made["config"]["n_expert"], made["config"]["n_expert_used"]
    per_m = samples.groupby(["model", "m"])["ms"].median().unstack("model").reset_index()
    per_m["moe_minus_dense_ms"] = per_m[moe] - per_m[dense]
    per_m["distinct_experts_per_layer"] = E * (1 - (1 - u / E) ** per_m["m"])
    per_m["expert_bytes_read"] = per_m["distinct_experts_per_layer"] * made["moe_layers"] * made["expert_bytes"]
    per_m["dense_ffn_bytes"] = zoo.get(dense).made["active_ffn_bytes"]
    per_m["label"] = LABEL
    rows = [{"model": k, "a_ms": f.a, "b_ms_per_row": f.b, "b_ci_low": f.b_ci[0], "b_ci_high": f.b_ci[1],
             "r2": f.r2, "label": LABEL} for k, f in fits.items()]
    return {
        "fits": pd.DataFrame(rows),
        "per_m": per_m,
        "expert_term_ms_per_row": diff,
        "expert_term_ci": (diff - half, diff + half),
        "extra_row_expert_bytes_max": made["extra_row_expert_bytes_max"],
        "label": LABEL,
    }
