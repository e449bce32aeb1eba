"""The cost model: fit verify(m) ~ a + b*m, and price speculation with it.

A step of k drafts costs D(k) + V(k+1) and yields E[accepted] + 1 tokens; plain
decoding costs H per token. Speculation pays when (D + V(k+1)) / (accepted + 1) < H.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

import numpy as np
import pandas as pd
from scipy import stats

from labkit.analysis.stats import pos_sum


def verify_frame(res: dict) -> pd.DataFrame:
    """Long table of every verify sample: columns m, ms (from ``bench_verify``'s result)."""
    rows = [(r["m"], v) for r in res["verify"] for v in r["values"]]
    return pd.DataFrame(rows, columns=["m", "ms"])


def per_m_table(res: dict) -> pd.DataFrame:
    """verify(m): median and range per m, and the ratio to the plain step H."""
    rows = [(r["m"], r["median"], r["min"], r["max"], r["n"]) for r in res["verify"]]
    df = pd.DataFrame(rows, columns=["m", "median_ms", "min_ms", "max_ms", "n"])
    H = res.get("H_ms") or {}
    h = H.get("median")
    df["x_H"] = df["median_ms"] / h if h else None
    if h and H.get("min") and H.get("max"):  # the ratio's own range: both measurements' noise
        df["x_H_min"] = df["min_ms"] / H["max"]
        df["x_H_max"] = df["max_ms"] / H["min"]
    return df


@dataclass
class LinearFit:
    """OLS fit of ms = a + b*m (+ c*[m odd] when ``parity``), on every sample, with 95% CIs."""

    a: float
    b: float
    a_ci: tuple[float, float]
    b_ci: tuple[float, float]
    r2: float
    n: int
    parity: float | None = None  # extra ms when m is odd (row-pair kernels), if fitted
    parity_ci: tuple[float, float] | None = None
    residual_by_m: dict | None = None  # median residual per m (ms)
    n_by_m: dict | None = None  # samples per m (None: a fit from before this was recorded)
    cov: list | None = None  # covariance of the coefficients (for the line's confidence band)
    t: float | None = None  # the t quantile used for the CIs

    def band(self, m) -> tuple[np.ndarray, np.ndarray]:
        """Pointwise confidence band of the fitted mean at ``m``."""
        m = np.asarray(m, dtype=float)
        X = np.column_stack([np.ones_like(m), m] + ([(m % 2 == 1).astype(float)] if self.parity is not None else []))
        se = np.sqrt(np.einsum("ij,jk,ik->i", X, np.asarray(self.cov), X))
        y = self.predict(m)
        return y - self.t * se, y + self.t * se

    def predict(self, m) -> np.ndarray:
        m = np.asarray(m, dtype=float)
        y = self.a + self.b * m
        if self.parity is not None:
            y = y + self.parity * (m % 2 == 1)
        return y

    def to_dict(self) -> dict:
        return asdict(self)


def fit_verify(df: pd.DataFrame, *, parity: bool = False, level: float = 0.95) -> LinearFit:
    """Least squares on all samples; CIs from the t distribution of the coefficient errors."""
    m = df["m"].to_numpy(float)
    y = df["ms"].to_numpy(float)
    cols = [np.ones_like(m), m] + ([(m % 2 == 1).astype(float)] if parity else [])
    X = np.column_stack(cols)
    beta, *_ = np.linalg.lstsq(X, y, rcond=None)
    resid = y - X @ beta
    n, p = X.shape
    dof = max(1, n - p)
    s2 = float(resid @ resid) / dof
    cov = s2 * np.linalg.pinv(X.T @ X)
    se = np.sqrt(np.diag(cov))
    t = stats.t.ppf(0.5 + level / 2, dof)
    ci = [(float(b - t * s), float(b + t * s)) for b, s in zip(beta, se, strict=True)]
    ss_tot = float(((y - y.mean()) ** 2).sum())
    r2 = 1.0 - float(resid @ resid) / ss_tot if ss_tot > 0 else 1.0
    by_m = pd.Series(resid).groupby(m).median()
    n_by_m = pd.Series(resid).groupby(m).size()
    return LinearFit(
        a=float(beta[0]), b=float(beta[1]), a_ci=ci[0], b_ci=ci[1], r2=r2, n=n,
        parity=float(beta[2]) if parity else None, parity_ci=ci[2] if parity else None,
        residual_by_m={int(k): float(v) for k, v in by_m.items()},
        n_by_m={int(k): int(v) for k, v in n_by_m.items()},
        cov=cov.tolist(), t=float(t),
    )


def fit_table(fit: LinearFit) -> pd.DataFrame:
    """The fit as a small table (term, estimate, CI) for logging and display."""
    rows = [("a (ms)", fit.a, *fit.a_ci), ("b (ms per row)", fit.b, *fit.b_ci)]
    if fit.parity is not None:
        rows.append(("odd-m extra (ms)", fit.parity, *fit.parity_ci))
    df = pd.DataFrame(rows, columns=["term", "estimate", "ci_low", "ci_high"])
    df["r2"] = fit.r2
    df["n"] = fit.n
    return df


# -- pricing speculation --------------------------------------------------------------
MIN_SAMPLES_AT_M = 3  # a row count measured at least this often is priced at its own median


@dataclass
class VerifyModel:
    """verify(m) as measured: the one-row step H on its own (its kernel is a matrix-vector
    product); every row count m >= 2 the bench measured (``MIN_SAMPLES_AT_M`` times or more)
    at its own median; and a + b*m + c*[m odd], fitted on m >= 2, between and beyond them.

    Why the medians and not the line where both exist: the kernels work in tiles of rows, so
    verify(m) is a staircase, not a line, and one step of it drags the whole fit. On the Intel
    box of 2026-12-06 with labkit's kernel (02's bench, m = 1..9, 16 rounds) the medians read
    17.4, 20.1, 22.2, 25.0, 28.8, 31.1, 34.7, 40.0 and 61.1 ms (m = 9 then left the patch's
    small-batch path; since 2026-12-07 9..16 rows take it too, but any tiled kernel can
    step), and the line with its odd-m term priced 17.4, 15.0, 22.9, 24.4, 32.2, 33.7, 41.6,
    43.1 and 50.9: two rows cheaper than one (-25%), seven rows +20%, nine -17%.
    The line stays what 01 reports (a, b, the odd-m extra) and what ``fitted`` returns."""

    H: float
    fit: LinearFit

    def fitted(self, m) -> np.ndarray:
        """H at m = 1, the fitted line above it (01's piecewise model, whose residuals it shows)."""
        m = np.asarray(m, dtype=float)
        return np.where(m <= 1, self.H, self.fit.predict(m))

    def V(self, m) -> np.ndarray:
        y = np.array(self.fitted(m), dtype=float)
        res, n = self.fit.residual_by_m or {}, self.fit.n_by_m or {}
        if not res or not n:
            return y
        flat, ms = y.reshape(-1), np.asarray(m, dtype=float).reshape(-1)
        for i, mv in enumerate(ms):
            key = int(mv) if mv >= 2 and float(mv).is_integer() else None
            if key is not None and n.get(key, 0) >= MIN_SAMPLES_AT_M and key in res:
                flat[i] += res[key]  # the line plus its median residual there: the median itself
        return flat.reshape(y.shape) if y.ndim else flat[0]

    def to_dict(self) -> dict:
        return {"H": self.H, "fit": self.fit.to_dict()}


def fit_verify_model(samples: pd.DataFrame) -> VerifyModel:
    h = float(samples.loc[samples["m"] == 1, "ms"].median())
    multi = samples[samples["m"] >= 2]
    return VerifyModel(H=h, fit=fit_verify(multi, parity=multi["m"].nunique() >= 3))


def _ols(x, y):
    X = np.column_stack([np.ones(len(x)), np.asarray(x, float)])
    beta, *_ = np.linalg.lstsq(X, np.asarray(y, float), rcond=None)
    return float(beta[0]), float(beta[1])


def draft_cost(rows: pd.DataFrame) -> dict:
    """D(k) = d0 + d1*k per drafter: least squares of draft ms per speculative step on k."""
    out = {}
    spec = rows[(rows["k"] > 0) & (~rows["cold"]) & (rows["steps"] > 0)]
    for d, g in spec.groupby("drafter"):
        per_step = g["draft_ms"] / g["steps"]
        out[d] = _ols(g["k"], per_step) if g["k"].nunique() > 1 else (float(per_step.median()), 0.0)
    return out


def step_overhead(rows: pd.DataFrame) -> tuple[float, float]:
    """o(m) = o0 + o1*(m-1): loop bookkeeping per step (argmax per row, rollback)."""
    warm = rows[(~rows["cold"]) & (rows["steps"] > 0)]
    m_mean = 1 + warm["drafted"] / warm["steps"]
    return _ols(m_mean - 1, warm["accept_ms"] / warm["steps"])


def acceptance_profile(rows: pd.DataFrame) -> dict:
    """Per (drafter, workload, temperature), from the runs at the largest k: the conditional
    acceptance alpha_i of draft position i, and P(draft length >= i+1) per step."""
    out = {}
    warm = rows[(~rows["cold"]) & (rows["k"] > 0)]
    for key, g in warm.groupby(["drafter", "workload", "temperature"]):
        top = g[g["k"] == g["k"].max()]
        kmax = int(top["k"].iloc[0])
        acc, tested, reach = (pos_sum(top[c], kmax) for c in ("acc_pos", "tested_pos", "drafts_reaching_pos"))
        steps = top["steps"].sum()
        alpha = np.where(tested[:kmax] > 0, acc[:kmax] / np.maximum(tested[:kmax], 1), 0.0)
        out[key] = {"alpha": alpha.tolist(), "p_len_ge": (reach[:kmax] / steps).tolist(), "k_max": kmax}
    return out


def expected_step(profile: dict, k: int, vm: VerifyModel, d: tuple[float, float], o: tuple[float, float]) -> dict:
    """Expected tokens and ms of one step at draft length k, from the acceptance profile."""
    k = min(k, profile["k_max"])
    alpha = np.asarray(profile["alpha"][:k])
    p_ge = np.asarray(profile["p_len_ge"][:k])  # P(L >= i+1), i = 0..k-1
    # P(draft length = j) for j = 0..k (capped at k)
    p_len = np.empty(k + 1)
    p_len[0] = 1 - (p_ge[0] if k else 0.0)
    for j in range(1, k + 1):
        p_len[j] = p_ge[j - 1] - (p_ge[j] if j < k else 0.0)
    cum = np.concatenate([[1.0], np.cumprod(alpha)])  # P(first j drafts all accepted)
    exp_acc = sum(p_len[j] * cum[1 : j + 1].sum() for j in range(k + 1))
    m = np.arange(1, k + 2)
    V = float((p_len * vm.V(m)).sum())
    D = d[0] + d[1] * k if k > 0 else 0.0
    ovh = o[0] + o[1] * float((p_len * (m - 1)).sum())
    return {"tokens": 1 + exp_acc, "V_ms": V, "D_ms": D, "O_ms": ovh, "ms": V + D + ovh}


LOSING_TERMS = {
    "a": "acceptance collapse (a)",
    "V": "verify explodes (V)",
    "D": "draft not cheap (D)",
    "spill": "spill",
}


def diagnose(e: dict, k: int, vm: VerifyModel, plain: float, *, residency: dict | None = None) -> dict | None:
    """Why a step at draft length ``k`` loses, in the chapter's terms, or None if it wins.

    Each way to lose is tested as a counterfactual on the expected step ``e``: would the
    step win with perfect acceptance (k+1 tokens; if so, acceptance collapse (a) is a
    cause), with a verify that costs no more than one plain step (V(k+1) = H: verify
    explodes), with a free draft (D = 0: draft not cheap)? The dominant term is the one
    whose removal saves the most ms per token. Spill is named beside V where the engine
    reported weights on the host (``residency``), since host-resident weights are what
    makes the verify of k+1 rows cost more than one row.
    """
    per_tok = e["ms"] / e["tokens"]
    if k == 0 or per_tok < plain:
        return None
    extra_v = e["V_ms"] - vm.H
    saves = {
        "a": per_tok - e["ms"] / (k + 1),  # all k drafts accepted
        "V": extra_v / e["tokens"],
        "D": e["D_ms"] / e["tokens"],
    }
    flips = {t: per_tok - s < plain for t, s in saves.items()}
    terms = [t for t in ("a", "V", "D") if flips[t]] or [max(saves, key=saves.get)]
    dom = max(saves, key=saves.get)
    spill = bool(residency and residency.get("spilled") and ("V" in terms or dom == "V"))
    if spill:
        terms.append("spill")
    text = (f"{LOSING_TERMS[dom]} dominates: (D {e['D_ms']:.1f} + V {e['V_ms']:.1f} ms) / {e['tokens']:.2f} tokens "
            f"= {per_tok:.1f} ms/token >= H {plain:.1f} ms; ways it loses: {', '.join(LOSING_TERMS[t] for t in terms)}")
    if spill:
        text += f" [{residency.get('label')}]"
    return {"term": dom, "terms": terms, "text": text}


def predict(cells: pd.DataFrame, rows: pd.DataFrame, vm: VerifyModel, *, residency: dict | None = None) -> pd.DataFrame:
    """Predicted vs measured decode tok/s per cell, the error, and why losing cells lose.

    Agreement is judged against the measurement's own uncertainty: ``inside_ci`` says whether
    the predicted speedup (predicted tok/s over the predicted plain tok/s) lies inside the
    cell's measured speedup CI (``speedup_lo``–``speedup_hi`` from ``cell_table``), not within
    a fixed 10%: on a noisy box a 10% band is either too strict or meaningless.

    A losing cell is explained by the inequality: cost per token (D + V(k+1) + o)/(accepted + 1)
    against the plain step H + o, named in the chapter's terms by :func:`diagnose`.
    """
    prof = acceptance_profile(rows)
    dc = draft_cost(rows)
    o = step_overhead(rows)
    plain = vm.H + o[0]
    out = []
    for c in cells.itertuples():
        if c.k == 0:
            e = {"tokens": 1.0, "V_ms": vm.H, "D_ms": 0.0, "O_ms": o[0], "ms": plain}
        else:
            key = (c.drafter, c.workload, c.temperature)
            if key not in prof:
                continue
            e = expected_step(prof[key], c.k, vm, dc.get(c.drafter, (0.0, 0.0)), o)
        pred = 1e3 * e["tokens"] / e["ms"]
        per_tok = e["ms"] / e["tokens"]
        why = diagnose(e, int(c.k), vm, plain, residency=residency)
        pred_speedup = plain / per_tok
        lo, hi = getattr(c, "speedup_lo", None), getattr(c, "speedup_hi", None)
        inside = bool(lo <= pred_speedup <= hi) if c.k and lo is not None and hi is not None and lo == lo else None
        out.append({"drafter": c.drafter, "workload": c.workload, "k": c.k, "temperature": c.temperature,
                    "measured_tok_s": c.tok_s, "predicted_tok_s": pred,
                    "error": pred / c.tok_s - 1 if c.tok_s else None,
                    "pred_speedup": pred_speedup, "measured_speedup": getattr(c, "speedup_gm", None),
                    "speedup_lo": lo, "speedup_hi": hi, "inside_ci": inside,
                    "pred_tokens_per_step": e["tokens"], "pred_D_ms": e["D_ms"], "pred_V_ms": e["V_ms"],
                    "pred_ms_per_token": per_tok, "H_ms": plain, "losing_term": why["text"] if why else None,
                    "losing_terms": ",".join(why["terms"]) if why else None})
    return pd.DataFrame(out)


def residual_table(samples: pd.DataFrame, linear: LinearFit, vm: VerifyModel) -> pd.DataFrame:
    """Median residual per m of the straight-line fit and of the piecewise (H + parity) model."""
    med = samples.groupby("m")["ms"].median().reset_index()
    med["linear_fit_ms"] = linear.predict(med["m"])
    med["piecewise_ms"] = vm.fitted(med["m"])
    med["linear_residual_ms"] = med["ms"] - med["linear_fit_ms"]
    med["piecewise_residual_ms"] = med["ms"] - med["piecewise_ms"]
    return med.rename(columns={"ms": "median_ms"})
