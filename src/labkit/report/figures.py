"""Figures: registered seaborn plot functions, stamped with their ``[LAB: …]`` ID.

A figure is always drawn by a function registered here from a DataFrame plus JSON-able
keyword arguments. That is what makes ``labkit regen`` possible: the logged data and
arguments are enough to draw it again, and the function also returns the data it drew,
whose hash shows whether the regeneration is identical.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd

from labkit.errors import LabkitError

PlotFn = Callable[..., tuple]  # (data, **kw) -> (Figure, drawn DataFrame)
PLOTS: dict[str, PlotFn] = {}


def register(kind: str):
    def deco(fn: PlotFn) -> PlotFn:
        PLOTS[kind] = fn
        return fn

    return deco


def get(kind: str) -> PlotFn:
    if kind not in PLOTS:
        raise LabkitError(f"unknown figure kind {kind!r}", f"registered kinds: {', '.join(sorted(PLOTS))}")
    return PLOTS[kind]


# -- drawing, stamping, saving ---------------------------------------------------------
def render(kind: str, data: pd.DataFrame, **kw):
    """Draw figure ``kind`` from ``data``; returns (Figure, drawn DataFrame)."""
    import seaborn as sns

    sns.set_theme(style="whitegrid", context="notebook")
    return get(kind)(data, **kw)


def stamp(fig, lab_id: str) -> None:
    """Write the provenance ID visibly on the figure."""
    fig.text(0.995, 0.005, f"[{lab_id}]", ha="right", va="bottom", fontsize=7, color="0.35", family="monospace")


def save(fig, folder: Path, *, lab_id: str, title: str) -> dict[str, Path]:
    """PNG, SVG and PDF (for a chapter to include), each carrying the ID in its metadata
    (PDF: Subject and Keywords) beside the visible stamp."""
    folder.mkdir(parents=True, exist_ok=True)
    png, svg, pdf = folder / "figure.png", folder / "figure.svg", folder / "figure.pdf"
    fig.savefig(png, dpi=120, bbox_inches="tight", metadata={"Title": title, "LAB": lab_id, "Software": "labkit"})
    fig.savefig(svg, bbox_inches="tight", metadata={"Title": title, "Identifier": lab_id, "Creator": "labkit"})
    fig.savefig(pdf, bbox_inches="tight", metadata={"Title": title, "Subject": lab_id, "Keywords": lab_id,
                                                    "Creator": "labkit"})
    return {"png": png, "svg": svg, "pdf": pdf}


def pdf_lab_id(path: Path) -> str | None:
    """Read the ID back from a PDF's document information (its Subject)."""
    import re

    m = re.search(rb"/Subject\s*\((.*?)(?<!\\)\)", Path(path).read_bytes(), re.S)
    return m.group(1).decode("latin-1") if m else None


def png_lab_id(path: Path) -> str | None:
    """Read the ID back from a PNG's text metadata."""
    from PIL import Image

    with Image.open(path) as im:
        return im.info.get("LAB")


# -- the plots --------------------------------------------------------------------------
@register("verify_cost")
def plot_verify_cost(data: pd.DataFrame, *, fit: dict | None = None, title: str = "verify(m)", H_ms=None,
                     bench: list[dict] | pd.DataFrame | None = None):
    """Every verify sample per m, the median per m, and the fitted a + b*m with its CI band.

    ``bench`` (``analysis.crosscheck.agreement``'s rows as records): llama-bench's prompt batch of m (one
    logit row) on the same build, and labkit's one-logit decode beside it; a judged row that
    disagrees is marked and named in the legend (a finding is shown, not hidden)."""
    import seaborn as sns

    fig, ax = plt.subplots(figsize=(7, 4.2))
    sns.stripplot(data=data, x="m", y="ms", native_scale=True, alpha=0.35, size=3, color="0.4", ax=ax, jitter=0.15)
    med = data.groupby("m", as_index=False)["ms"].agg(median_ms="median", min_ms="min", max_ms="max")
    ax.plot(med["m"], med["median_ms"], "o", color="C0", label="median per m", zorder=5)
    drawn = med
    if fit:
        from labkit.analysis.costmodel import LinearFit

        lf = LinearFit(**{k: (tuple(v) if k.endswith("_ci") and v is not None else v) for k, v in fit.items()})
        ms = np.arange(int(data["m"].min()), int(data["m"].max()) + 1)
        line = lf.predict(ms)
        lo, hi = lf.band(ms)
        label = f"fit a={lf.a:.1f} ms, b={lf.b:.2f} ms/row" + (
            f", odd m +{lf.parity:.1f} ms" if lf.parity is not None else "") + f", R²={lf.r2:.2f}"
        ax.plot(ms, line, "-" if lf.parity is None else "--", color="C1", label=label, marker="" if lf.parity is None else "x")
        ax.fill_between(ms, lo, hi, color="C1", alpha=0.15, label="95% CI of the fitted mean")
        drawn = drawn.merge(pd.DataFrame({"m": ms, "fit_ms": line, "fit_lo": lo, "fit_hi": hi}), on="m", how="outer")
    if H_ms is not None:
        ax.axhline(H_ms, ls=":", color="C2", label=f"plain step H = {H_ms:.1f} ms")
    bench = pd.DataFrame(bench) if bench is not None else None  # records: the figure's kwargs are logged as JSON
    if bench is not None and not bench.empty:
        pp = bench[bench["judged"] & ~bench["quantity"].str.startswith("plain step")].sort_values("m")
        if len(pp):
            ax.plot(pp["m"], pp["llama_bench_ms"], "^", color="C3", ms=7, label="llama-bench pp m (1 logit row)")
            ax.plot(pp["m"], pp["labkit_ms"], "v", color="C4", ms=6, mfc="none", label="labkit, m rows, 1 logit row")
            bad = pp[pp["verdict"] == "disagree"]
            if len(bad):
                ax.plot(bad["m"], bad["llama_bench_ms"], "x", color="red", ms=12, mew=2,
                        label=f"disagree beyond ±{bad['tolerance'].iloc[0]:.0%}: m={', '.join(map(str, bad['m']))}")
            drawn = drawn.merge(pp[["m", "llama_bench_ms", "labkit_ms", "ratio", "lo", "hi", "verdict"]].rename(
                columns={"labkit_ms": "labkit_1logit_ms", "ratio": "bench_ratio", "lo": "bench_lo",
                         "hi": "bench_hi", "verdict": "bench_verdict"}), on="m", how="outer")
    ax.set_xticks(sorted(data["m"].unique()))
    ax.set_xlabel("rows verified m = k + 1")
    ax.set_ylabel("ms per verify")
    ax.set_title(title)
    ax.legend(fontsize=8, loc="upper left")
    fig.tight_layout()
    return fig, drawn


@register("speedup_heatmap")
def plot_speedup_heatmap(data: pd.DataFrame, *, title: str = "speedup vs plain decoding", value: str = "speedup"):
    """Workload x k heatmap of median speedup, one panel per drafter (greedy rows only)."""
    import seaborn as sns

    d = data[data["k"] > 0]
    drafters = sorted(d["drafter"].unique())
    fig, axes = plt.subplots(1, len(drafters), figsize=(5.2 * len(drafters), 3.6), squeeze=False)
    drawn = []
    for ax, dr in zip(axes[0], drafters):
        piv = d[d["drafter"] == dr].pivot_table(index="workload", columns="k", values=value, aggfunc="median")
        sns.heatmap(piv, annot=True, fmt=".2f", center=1.0, cmap="RdBu", ax=ax, cbar=False, vmin=0.3, vmax=1.7)
        ax.set_title(f"{dr}: {value}")
        long = piv.reset_index().melt(id_vars="workload", var_name="k", value_name=value)
        long.insert(0, "drafter", dr)
        drawn.append(long)
    fig.suptitle(title)
    fig.tight_layout()
    return fig, pd.concat(drawn, ignore_index=True)


@register("tok_s_vs_k")
def plot_tok_s_vs_k(data: pd.DataFrame, *, title: str = "decode tok/s vs k"):
    """Median decode tok/s per k with min-max error bars, one line per workload, a panel per drafter."""
    d = data.sort_values("k")
    drafters = sorted(x for x in d["drafter"].unique() if x != "none")
    base = d[d["k"] == 0]
    fig, axes = plt.subplots(1, len(drafters), figsize=(5.2 * len(drafters), 3.8), squeeze=False, sharey=True)
    drawn = []
    for ax, dr in zip(axes[0], drafters):
        g = pd.concat([base.assign(drafter=dr), d[d["drafter"] == dr]])
        for i, (wl, w) in enumerate(g.groupby("workload")):
            ax.errorbar(w["k"], w["tok_s"], yerr=[w["tok_s"] - w["tok_s_min"], w["tok_s_max"] - w["tok_s"]],
                        marker="o", capsize=2, label=wl, color=f"C{i}")
        ax.set_title(dr)
        ax.set_xlabel("k (draft length)")
        ax.set_ylabel("decode tok/s (median, min-max)")
        drawn.append(g[["drafter", "workload", "k", "tok_s", "tok_s_min", "tok_s_max"]])
    axes[0][-1].legend(fontsize=7)
    fig.suptitle(title)
    fig.tight_layout()
    return fig, pd.concat(drawn, ignore_index=True)


@register("accept_by_position")
def plot_accept_by_position(data: pd.DataFrame, *, title: str = "acceptance by draft position",
                            value: str = "accept_cond"):
    """Per-position acceptance (position 0 = first drafted token), a line per workload, a panel per drafter."""
    drafters = sorted(data["drafter"].unique())
    fig, axes = plt.subplots(1, len(drafters), figsize=(5.2 * len(drafters), 3.6), squeeze=False, sharey=True)
    for ax, dr in zip(axes[0], drafters):
        g = data[data["drafter"] == dr]
        for i, (wl, w) in enumerate(g.groupby("workload")):
            ax.plot(w["position"], w[value], marker="o", label=wl, color=f"C{i}")
        ax.set_title(dr)
        ax.set_xlabel("draft position")
        ax.set_ylim(0, 1.02)
    axes[0][0].set_ylabel({"accept_cond": "P(accept i | accepted < i)", "accept_per_draft": "accepted at i / drafts"}
                          .get(value, value))
    axes[0][-1].legend(fontsize=7)
    fig.suptitle(title)
    fig.tight_layout()
    return fig, data[["drafter", "workload", "position", value]].reset_index(drop=True)


@register("predicted_vs_measured")
def plot_predicted_vs_measured(data: pd.DataFrame, *, title: str = "cost model: predicted vs measured tok/s"):
    import seaborn as sns

    fig, ax = plt.subplots(figsize=(5.2, 4.6))
    sns.scatterplot(data=data, x="measured_tok_s", y="predicted_tok_s", hue="workload", style="drafter", ax=ax)
    lo = float(min(data["measured_tok_s"].min(), data["predicted_tok_s"].min())) * 0.9
    hi = float(max(data["measured_tok_s"].max(), data["predicted_tok_s"].max())) * 1.1
    xs = np.array([lo, hi])
    ax.plot(xs, xs, "k-", lw=0.8)
    ax.fill_between(xs, xs * 0.9, xs * 1.1, color="0.5", alpha=0.15, label="±10%")
    ax.set_xlim(lo, hi)
    ax.set_ylim(lo, hi)
    within = float((data["error"].abs() <= 0.10).mean())
    ax.set_title(f"{title}\n{within:.0%} of cells within ±10%")
    ax.legend(fontsize=7)
    fig.tight_layout()
    return fig, data[["drafter", "workload", "k", "measured_tok_s", "predicted_tok_s", "error"]].reset_index(drop=True)


@register("acceptance_vs_repetition")
def plot_acceptance_vs_repetition(data: pd.DataFrame, *, title: str = "n-gram acceptance vs output repetition"):
    """Per generation: acceptance against the share of repeated 4-grams in the output."""
    import seaborn as sns

    fig, ax = plt.subplots(figsize=(5.6, 4.2))
    sns.scatterplot(data=data, x="repetition", y="acceptance", hue="workload", style="temperature", ax=ax)
    ax.set_xlabel("share of 4-grams already seen in the output (loop indicator)")
    ax.set_ylabel("acceptance (accepted / drafted)")
    ax.set_title(title)
    fig.tight_layout()
    return fig, data[["workload", "prompt", "temperature", "k", "repetition", "acceptance"]].reset_index(drop=True)


@register("arch_contrast")
def plot_arch_contrast(data: pd.DataFrame, *, title: str = "verify(m): dense vs MoE (SYNTHETIC, cost only)"):
    """Median verify(m) per model with min-max bars; the label says the models are synthetic."""
    fig, ax = plt.subplots(figsize=(6.4, 4.2))
    g = data.groupby(["model", "m"])["ms"].agg(["median", "min", "max"]).reset_index()
    for i, (model, w) in enumerate(g.groupby("model")):
        ax.errorbar(w["m"], w["median"], yerr=[w["median"] - w["min"], w["max"] - w["median"]], marker="o",
                    capsize=2, label=model, color=f"C{i}")
    ax.set_xticks(sorted(data["m"].unique()))
    ax.set_xlabel("rows verified m")
    ax.set_ylabel("ms per verify (median, min-max)")
    ax.set_title(title)
    ax.text(0.02, 0.97, "SYNTHETIC random weights: valid for cost only", transform=ax.transAxes, va="top",
            fontsize=8, color="C3")
    ax.legend(fontsize=8, loc="lower right")
    fig.tight_layout()
    return fig, g


@register("op_profile")
def plot_op_profile(data: pd.DataFrame, *, title: str = "where a verify's time goes", note: str | None = None):
    """ms per op class (stacked) for each m: a breakdown of one decode, not a timing."""
    t = data.pivot(index="m", columns="op_class", values="ms")
    t = t[list(data["op_class"].drop_duplicates())]  # the classes in the order given
    fig, ax = plt.subplots(figsize=(6.8, 4.2))
    bottom = np.zeros(len(t))
    for i, c in enumerate(t.columns):
        ax.bar(t.index, t[c], bottom=bottom, label=c, color=f"C{i}")
        bottom += t[c].to_numpy()
    ax.set_xticks(list(t.index))
    ax.set_xlabel("rows verified m (every logit row)")
    ax.set_ylabel("ms per op class (median over rounds)")
    ax.set_title(title)
    ax.text(0.02, 0.97, note or "per-node callbacks: a breakdown, not a timing (dispatch is its own class)",
            transform=ax.transAxes, va="top", fontsize=8, color="C3")
    ax.legend(fontsize=7, loc="center left", bbox_to_anchor=(1.0, 0.5))
    fig.tight_layout()
    return fig, data[["m", "op_class", "ms"]].reset_index(drop=True)


@register("replay_vs_measured")
def plot_replay_vs_measured(data: pd.DataFrame, *, title: str = "replay prediction vs measured, per k (greedy)"):
    """Per drafter: predicted e2e speedup and acceptance for every k (lines, from the replay of
    one plain run), measured ones where the protocol ran the arm (points, bars: the 95% CI, or
    the pairs' min-max range for tables logged before CIs existed)."""
    fig, axes = plt.subplots(1, 2, figsize=(9.5, 4.0))
    cols = ["drafter", "k", "pred_e2e_speedup", "pred_acceptance", "e2e_speedup", "e2e_speedup_min",
            "e2e_speedup_max", "acceptance"]
    d = data.reindex(columns=cols).sort_values(["drafter", "k"])
    if "e2e_lo" in data and "e2e_hi" in data:
        d["e2e_speedup_min"], d["e2e_speedup_max"] = data["e2e_lo"], data["e2e_hi"]
    for i, (name, g) in enumerate(d.groupby("drafter")):
        c = f"C{i}"
        m = g[g["e2e_speedup"].notna()]
        axes[0].plot(g["k"], g["pred_e2e_speedup"], "-", color=c, label=f"{name} predicted")
        axes[0].errorbar(m["k"], m["e2e_speedup"], yerr=[m["e2e_speedup"] - m["e2e_speedup_min"],
                                                         m["e2e_speedup_max"] - m["e2e_speedup"]],
                         fmt="o", color=c, capsize=3, label=f"{name} measured")
        axes[1].plot(g["k"], g["pred_acceptance"], "-", color=c, label=f"{name} replayed")
        axes[1].plot(m["k"], m["acceptance"], "o", color=c, label=f"{name} measured")
    axes[0].axhline(1.0, color="k", lw=0.8)
    axes[0].set(xlabel="k (draft length)", ylabel="end-to-end speedup vs plain")
    axes[1].set(xlabel="k (draft length)", ylabel="acceptance (accepted / drafted)", ylim=(0, 1.05))
    for ax in axes:
        ax.legend(fontsize=7)
    fig.suptitle(title)
    fig.tight_layout()
    return fig, d.reset_index(drop=True)


@register("tok_s_vs_c")
def plot_tok_s_vs_c(data: pd.DataFrame, *, title: str = "throughput vs concurrency c"):
    """Aggregate tok/s (min-max bars) and per-stream tok/s vs c, a line per (engine, drafter, k)
    (a draft length policy's arm, drafter "<drafter>+<policy>", is its own line at its k_max)."""
    d = data.sort_values("c")
    fig, axes = plt.subplots(1, 2, figsize=(10.4, 3.9))
    drawn = []
    for i, ((eng, drafter, k), g) in enumerate(d.groupby(["engine", "drafter", "k"], dropna=False)):
        style = "-" if eng == "labkit" else "--"
        label = (f"{eng} {drafter} (k_max {k})" if "+" in str(drafter)
                 else f"{eng} k={k}" + (f" ({drafter})" if k else " (plain)"))
        lo = (g["agg_tok_s"] - g["agg_tok_s_min"]).fillna(0).clip(lower=0)
        hi = (g["agg_tok_s_max"] - g["agg_tok_s"]).fillna(0).clip(lower=0)
        axes[0].errorbar(g["c"], g["agg_tok_s"], yerr=[lo, hi], ls=style, marker="o", capsize=2, label=label,
                         color=f"C{i}")
        axes[1].plot(g["c"], g["per_stream_tok_s"], ls=style, marker="o", label=label, color=f"C{i}")
        drawn.append(g[["engine", "k", "c", "agg_tok_s", "agg_tok_s_min", "agg_tok_s_max", "per_stream_tok_s"]])
    for ax, what in zip(axes, ("aggregate tok/s (median, min-max)", "per-stream tok/s (median)")):
        ax.set_xlabel("concurrent streams c")
        ax.set_ylabel(what)
        ax.set_xticks(sorted(d["c"].unique()))
    axes[0].legend(fontsize=7)
    fig.suptitle(title)
    fig.tight_layout()
    return fig, pd.concat(drawn, ignore_index=True)


@register("policy_j")
def plot_policy_j(data: pd.DataFrame, *, title: str = "where the draft length policy chose which j"):
    """``sweep_tables.policy_j_table``: the share of steps at each j, stacked, per workload
    (left: the whole generation) and per quarter of the generation (right, all workloads)."""
    d = data[data["segment"] == "all"]
    js = sorted(data["j"].unique())
    fig, axes = plt.subplots(1, 2, figsize=(10.4, 3.6))
    for ax, (frame, by) in zip(axes, ((d, "workload"), (data[data["segment"] != "all"], "segment"))):
        t = frame.groupby([by, "j"])["steps"].sum().unstack(fill_value=0).reindex(columns=js, fill_value=0)
        t = t.div(t.sum(axis=1), axis=0)
        if by == "segment":
            from labkit.analysis.sweep_tables import SEGMENTS

            t = t.reindex([s for s in SEGMENTS if s in t.index])
        bottom = np.zeros(len(t))
        for i, j in enumerate(js):
            ax.bar(range(len(t)), t[j].to_numpy(), bottom=bottom, color=f"C{i}", label=f"j = {j}")
            bottom += t[j].to_numpy()
        ax.set_xticks(range(len(t)), t.index, rotation=20, fontsize=8)
        ax.set_ylabel("share of steps")
        ax.set_ylim(0, 1)
    axes[0].set_title("per workload")
    axes[1].set_title("per quarter of the generation")
    axes[1].legend(fontsize=7, bbox_to_anchor=(1.02, 1), loc="upper left")
    fig.suptitle(title)
    fig.tight_layout()
    return fig, data.reset_index(drop=True)


@register("calibration")
def plot_calibration(data: pd.DataFrame, *, title: str = "draft length policy: predicted vs realised acceptance",
                     tolerance: float = 0.05, min_samples: int = 30):
    """Reliability diagram from ``analysis.calibration.table``: realised vs mean predicted
    acceptance per bin (marker area ~ samples; hollow: too few to judge), the diagonal ± tolerance."""
    from labkit.analysis.calibration import verdict

    fig, ax = plt.subplots(figsize=(5.2, 4.8))
    xs = np.array([0.0, 1.0])
    ax.plot(xs, xs, "k-", lw=0.8)
    ax.fill_between(xs, xs - tolerance, xs + tolerance, color="0.5", alpha=0.15, label=f"±{100 * tolerance:g} pts")
    group = next((c for c in ("drafter", "workload", "position") if c in data.columns), None)
    parts = data.groupby(group) if group else [("all", data)]
    for i, (name, g) in enumerate(parts):
        size = 20 + 200 * g["n"] / max(1, data["n"].max())
        full = g["n"] >= min_samples
        ax.scatter(g.loc[full, "predicted"], g.loc[full, "realised"], s=size[full], color=f"C{i}", label=str(name))
        ax.scatter(g.loc[~full, "predicted"], g.loc[~full, "realised"], s=size[~full], facecolors="none",
                   edgecolors=f"C{i}")
    ax.set_xlim(0, 1.02)
    ax.set_ylim(0, 1.02)
    ax.set_xlabel("predicted P(accept | earlier accepted), bin mean")
    ax.set_ylabel("realised acceptance")
    ax.set_title(f"{title}\n{verdict(data, tolerance=tolerance, min_samples=min_samples)[:90]}", fontsize=9)
    ax.legend(fontsize=7)
    fig.tight_layout()
    return fig, data.reset_index(drop=True)


@register("plan_speedup_vs_spill")
def plot_speedup_vs_spill(data: pd.DataFrame, *, points: list | None = None,
                          title: str = "predicted speedup vs spilled layers"):
    """One line per n_max (the plan), the published §E points overlaid where given."""
    import seaborn as sns

    fig, ax = plt.subplots(figsize=(7, 4.2))
    sns.lineplot(data=data, x="spilled_layers", y="speedup", hue="n_max", marker="o", ax=ax, palette="viridis")
    pts = pd.DataFrame(points or [])
    if not pts.empty:
        ax.scatter(pts["spilled_layers"], pts["speedup"], marker="*", s=140, color="crimson", zorder=5,
                   label="published §E")
        for _, r in pts.iterrows():
            ax.annotate(f"n_max={int(r['n_max'])}", (r["spilled_layers"], r["speedup"]), fontsize=7,
                        xytext=(4, 4), textcoords="offset points")
    ax.axhline(1.0, color="grey", lw=0.8, ls="--")
    ax.set(xlabel="layers spilled to the host", ylabel="speedup × vs plain (predicted)", title=title)
    ax.legend(fontsize=8)
    fig.tight_layout()
    return fig, data


@register("forest")
def plot_forest(data: pd.DataFrame, *, margin: float = 0.02, title: str | None = None):
    """Speedup with its CI per (drafter, k) × workload (and pooled), the margin band shaded,
    the A/A control on top: what each verdict rests on, at a glance."""
    cols = ["label", "drafter", "k", "workload", "ratio", "lo", "hi", "verdict", "basis", "confidence"]
    d = data.reindex(columns=cols).reset_index(drop=True)
    n = len(d)
    fig, ax = plt.subplots(figsize=(7.5, 0.9 + 0.28 * max(n, 1)))
    ax.axvspan(1 - margin, 1 + margin, color="0.88", zorder=0, label=f"no difference (±{margin:.0%})")
    ax.axvline(1.0, color="k", lw=0.8)
    colours = {"wins": "tab:green", "loses": "tab:red", "no measurable difference": "0.45"}
    y = np.arange(n)[::-1]
    for yi, r in zip(y, d.itertuples()):
        if r.ratio is None or r.ratio != r.ratio:
            continue
        hi = r.hi if np.isfinite(r.hi) else r.ratio
        ax.plot([r.lo, hi], [yi, yi], color=colours.get(r.verdict, "0.45"), lw=2)
        ax.plot(r.ratio, yi, "o", color=colours.get(r.verdict, "0.45"), ms=5)
        ax.text(1.01, yi, f"{r.ratio:.2f}× [{r.lo:.2f}–{hi:.2f}] {r.verdict}", transform=ax.get_yaxis_transform(),
                va="center", fontsize=7)
    ax.set_yticks(y, d["label"].tolist(), fontsize=8)
    basis = d["basis"].dropna().iloc[0] if d["basis"].notna().any() else "end-to-end"
    conf = d["confidence"].dropna().iloc[0] if d["confidence"].notna().any() else 0.95
    ax.set(xlabel=f"{basis} speedup vs plain (geometric mean, {conf:.0%} CI)")
    ax.legend(fontsize=7, loc="lower left")
    ax.set_title(title or "speedup with its confidence interval; the A/A control on top")
    fig.tight_layout()
    return fig, d
