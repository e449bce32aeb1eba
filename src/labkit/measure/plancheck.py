"""`labkit plan --check`: the planner's predictions for the models on this box, beside measurement.

What is checked (all on the host, the only place a CPU box can put weights):
- verify(m), m = 1..8, of the embedded model (the calibration model: in-sample, its check
  shows only how well the straight-line-plus-odd-row form fits) and of the SYNTHETIC dense and
  MoE cost models at two sizes each (4 and 8 layers; out of sample: the profile never saw them);
- the thread-count placements: the embedded model at every thread count the probe read
  bandwidth at, other than its own (out of sample: ``machine.at_threads`` scales the compute
  rates, measured at the probe's count only);
- the default recipe's n-gram cells k = 1..3 on a small greedy sweep (one prompt each of two
  workloads, few runs): the planner is given the acceptance those runs measured (it prices
  cost, not acceptance) and the draft lengths the n-gram drafter produced (it drafts fewer
  than k where it finds no match), and its speedup is set beside the measured one and that
  one's interval (``decide.compare``).

The residual (median absolute error per model and overall) goes into the machine profile.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

import numpy as np
import pandas as pd

from labkit.analysis import decide, plan
from labkit.artifacts import synthetic, zoo
from labkit.artifacts.gguf_profile import read_profile
from labkit.measure import machine
from labkit.measure.verify_cost import Progress
from labkit.paths import cache_dir

EMBEDDED = "gemma-3-270m-q4_k_m"
LARGE = {"synthetic-dense-x2": "synthetic-dense", "synthetic-moe-x2": "synthetic-moe"}  # 8 layers, not 4
SWEEP_WORKLOADS = ("edit", "code")


def _synthetic_path(name: str) -> Path:
    """A zoo synthetic model, or a larger variant written once into the cache (SYNTHETIC)."""
    if name not in LARGE:
        return zoo.get(name).path
    path = cache_dir() / "machine" / f"{name}.gguf"
    if not path.exists():
        path.parent.mkdir(parents=True, exist_ok=True)
        synthetic.CONFIGS.setdefault(name, {**synthetic.CONFIGS[LARGE[name]], "n_layer": 8})
        tmp = path.with_name(f"{path.name}.{os.getpid()}.partial")  # two processes may write it at once
        synthetic.write(name, tmp)
        os.replace(tmp, path)
    return path


def _check_rows(path, profile: dict, *, model: str, synthetic: bool, in_sample: bool, threads: int | None,
                rounds: int, kv_depth: int, llc: int | None = None) -> list[dict]:
    """verify(m), m = 1..8, of the GGUF at ``path`` measured at ``threads``, beside the plan
    ``profile`` prices for it. A model whose step reads fewer bytes than the last-level cache
    (``llc``) holds is also measured with the cache flushed before every decode, as a model
    larger than the cache runs (``measured_flushed_ms``): the planner prices reads from
    memory, and back-to-back decodes of a cache-sized model read from the cache instead."""
    prof = read_profile(path)
    step_bytes = machine.active_params(prof)["bytes"]
    resident = bool(llc and step_bytes <= llc)
    res = machine.bench_model(path, m_values=list(range(1, 9)), rounds=rounds, kv_depth=kv_depth, threads=threads)
    flushed = {}
    if resident:
        fl = machine.bench_model(path, m_values=list(range(1, 9)), rounds=rounds, kv_depth=kv_depth, threads=threads,
                                 before=machine.cache_flusher(llc))
        flushed = {r["m"]: r["median"] for r in fl["verify"]}
    out = []
    for r in res["verify"]:
        pred = plan.verify_ms(prof, profile, plan.Placement(), r["m"])
        f = flushed.get(r["m"])
        out.append({"model": model, "synthetic": synthetic, "in_sample": in_sample, "m": r["m"], "threads": threads,
                    "measured_ms": r["median"], "measured_min_ms": r["min"], "measured_max_ms": r["max"],
                    "predicted_ms": pred, "error": pred / r["median"] - 1, "step_bytes": step_bytes,
                    "llc_bytes": llc, "cache_resident": resident, "measured_flushed_ms": f,
                    "error_flushed": pred / f - 1 if f else None})
    return out


def verify_check(profile: dict, *, names, rounds: int, threads: int | None, kv_depth: int = 200,
                 llc: int | None = None, progress: Progress = None) -> pd.DataFrame:
    """Predicted vs measured verify(m) per model and m (medians), with the relative error;
    ``llc``: the last-level cache's bytes (``_check_rows``)."""
    rows = []
    for name in names:
        if progress:
            progress(f"check: verify(m) of {name}, {rounds} rounds")
        rows += _check_rows(zoo.get(name).path if name == EMBEDDED else _synthetic_path(name), profile, model=name,
                            synthetic=name != EMBEDDED, in_sample=name == EMBEDDED, threads=threads, rounds=rounds,
                            kv_depth=kv_depth, llc=llc)
    return pd.DataFrame(rows)


def thread_check(profile: dict, *, counts, rounds: int, kv_depth: int = 200, progress: Progress = None) -> pd.DataFrame:
    """The thread-count placements: the embedded model's verify(m) at each of ``counts`` threads
    (other than the probe's own), predicted from the profile as ``machine.at_threads`` sees it
    (bandwidth measured at that count, compute scaled from the probe's), beside measurement.
    Out of sample: the probe calibrated its rates at its own thread count only."""
    rows = []
    for t in counts:
        if progress:
            progress(f"check: verify(m) of {EMBEDDED} at {t} thread(s), {rounds} rounds")
        rows += _check_rows(zoo.get(EMBEDDED).path, machine.at_threads(profile, t),
                            model=f"{EMBEDDED} @ {t} thread{'s' if t > 1 else ''}", synthetic=False, in_sample=False,
                            threads=t, rounds=rounds, kv_depth=kv_depth)
    return pd.DataFrame(rows)


def sweep_check(profile: dict, prompts: list, *, runs: int = 2, max_tokens: int = 48, threads: int | None = None,
                progress: Progress = None) -> tuple[pd.DataFrame, pd.DataFrame]:
    """(cells, rows): n-gram k = 1..3 measured on ``prompts`` (``workloads.Prompt``s), and predicted."""
    from labkit.config.recipe import load
    from labkit.config.runtime import make_drafter
    from labkit.engines.llamacpp import LlamaCppEngine
    from labkit.measure.sweep import k_sweep

    R = load("default")
    art = zoo.get(EMBEDDED)
    prof = read_profile(art.path)
    with LlamaCppEngine(str(art.path), n_ctx=2048, n_threads=threads or R.threads) as e:
        drafter = make_drafter("ngram", R, e)
        rows = k_sweep(e, prompts, drafters={"ngram": drafter}, ks=[0, 1, 2, 3], runs=runs, max_tokens=max_tokens,
                       seed=R.seed, progress=progress)
    warm = rows[~rows["cold"].astype(bool)]
    cells = []
    base = plan.verify_ms(prof, profile, plan.Placement(), 1)
    for k in (1, 2, 3):
        g = warm[(warm["k"] == k)]
        p = plan.pooled_positions(g["acc_pos"], g["steps"].sum(), k)
        # the n-gram drafter drafts fewer than k (often none) where it finds no match: price that
        ge = [sum(int(a[i]) for a in g["drafts_reaching_pos"]) / g["steps"].sum() for i in range(k)]
        c = plan.cell(prof, profile, plan.Placement(), k, p, len_ge=ge)
        est = decide.compare(rows, arm={"drafter": "ngram", "k": k}, value="decode_tok_s")
        cells.append({"drafter": "ngram", "k": k, "workloads": ",".join(sorted({p.workload for p in prompts})),
                      "acceptance_p1": p[0], "draft_len_mean": sum(ge), "tokens_per_step": c["tokens_per_step"],
                      "measured_speedup": est.ratio, "measured_lo": est.lo, "measured_hi": est.hi,
                      "verdict": est.verdict, "line": est.line(f"ngram n_max={k} (decode tok/s, measured)"),
                      "predicted_speedup": c["speedup"], "error": c["speedup"] / est.ratio - 1,
                      "predicted_H_ms": base, "predicted_V_ms": c["V_ms"]})
    return pd.DataFrame(cells), rows


def with_drift(verify: pd.DataFrame, profile: dict) -> pd.DataFrame:
    """Add how far the box moved since the probe: the calibration model's plain step now over
    then (a shared box's load changes by the hour), and each error with that drift taken out."""
    now = verify.loc[verify["in_sample"] & (verify["m"] == 1), "measured_ms"]
    then = (profile.get("calibration") or {}).get("H_ms")
    drift = float(now.iloc[0] / then) if len(now) and then else 1.0
    return verify.assign(drift=drift, error_drift_removed=verify["predicted_ms"] * drift / verify["measured_ms"] - 1)


def residual(verify: pd.DataFrame, cells: pd.DataFrame | None) -> dict:
    """The errors as the profile keeps them: median |error| overall, out of sample, per model."""
    oos = verify.loc[~verify["in_sample"]]
    out = {"checked_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
           "drift": float(verify["drift"].iloc[0]),
           "verify_median_abs_error_drift_removed_out_of_sample": float(oos["error_drift_removed"].abs().median()),
           "models": int(verify["model"].nunique()),
           "verify_median_abs_error": float(verify["error"].abs().median()),
           "verify_median_abs_error_out_of_sample": float(verify.loc[~verify["in_sample"], "error"].abs().median()),
           "per_model": {m: float(g["error"].abs().median()) for m, g in verify.groupby("model")}}
    if "cache_resident" in verify and verify["cache_resident"].any():  # beside the headline, never in it
        res = verify[verify["cache_resident"]]
        out["cache_resident_models"] = sorted(res["model"].unique())
        out["per_model_flushed"] = {m: float(g["error_flushed"].astype(float).abs().median())
                                    for m, g in res.groupby("model")}
    if cells is not None and not cells.empty:
        out["speedup_median_abs_error"] = float(cells["error"].abs().median())
        out["speedup_cells"] = cells[["k", "measured_speedup", "predicted_speedup", "error"]].to_dict("records")
    return out


def run_check(profile: dict, *, prompts: list | None = None, rounds: int = 8, threads: int | None = None,
              llc: int | None | str = "this", progress: Progress = None) -> dict:
    """The whole check; ``prompts`` (one per SWEEP_WORKLOADS entry, say) for the k = 1..3 cells, None: none;
    ``llc``: the last-level cache's bytes ("this": as this host reports it; None: not looked at)."""
    names = [EMBEDDED, "synthetic-dense", "synthetic-dense-x2", "synthetic-moe", "synthetic-moe-x2"]
    threads = threads or profile.get("threads")  # the thread count the profile was measured at
    llc = machine.llc_bytes() if llc == "this" else llc
    t0 = time.perf_counter()
    v = verify_check(profile, names=names, rounds=rounds, threads=threads, llc=llc, progress=progress)
    measured = sorted(int(t) for t in (profile.get("host") or {}).get("bandwidth_by_threads") or {})
    counts = [t for t in measured if t != threads]  # thread-count placements (none: a 1-core box, or an old profile)
    if counts:
        v = pd.concat([v, thread_check(profile, counts=counts, rounds=rounds, progress=progress)], ignore_index=True)
    v = with_drift(v, profile)
    cells, rows = sweep_check(profile, prompts, threads=threads, progress=progress) if prompts else (None, None)
    return {"verify": v, "cells": cells, "sweep_rows": rows, "residual": residual(v, cells),
            "seconds": round(time.perf_counter() - t0, 1), "rounds": rounds,
            "label": "synthetic models: SYNTHETIC random weights, valid for cost only"}


def summary_lines(res: dict) -> list[str]:
    r = res["residual"]
    lines = ["predicted vs measured on this box (verify(m) medians; error = predicted/measured − 1):"]
    for m, g in res["verify"].groupby("model", sort=False):
        errs = " ".join(f"{x:+.0%}" for x in g["error"])
        tag = (" (calibration model, in sample)" if g["in_sample"].iloc[0] else " (SYNTHETIC)"
               if g["synthetic"].iloc[0] else " (out of sample: the probe's rates at another thread count)")
        lines.append(f"  {m:<22} m=1..8: {errs}   median |error| {np.median(g['error'].abs()):.0%}{tag}")
        if "cache_resident" in g and g["cache_resident"].any():
            fl = g["error_flushed"].astype(float)
            slower = float(np.median(g["measured_flushed_ms"].astype(float) / g["measured_ms"])) - 1
            lines.append(f"  {'':<22} {g['step_bytes'].iloc[0] / 1e6:.0f} MB a step, within this box's "
                         f"{g['llc_bytes'].iloc[0] / 2**20:.0f} MiB last-level cache; the cache flushed before each "
                         f"decode (as a larger model runs, and as the planner prices): {slower:+.0%} slower, error "
                         f"{' '.join(f'{x:+.0%}' for x in fl)}   median |error| {np.median(fl.abs()):.0%}")
    lines.append(f"  all models: median |error| {r['verify_median_abs_error']:.1%} "
                 f"(out of sample {r['verify_median_abs_error_out_of_sample']:.1%}); the box moved "
                 f"{r['drift']:.2f}× since the probe (the calibration model's plain step); with that taken out, "
                 f"out of sample {r['verify_median_abs_error_drift_removed_out_of_sample']:.1%}")
    if res.get("cells") is not None:
        for c in res["cells"].itertuples():
            lines.append(f"  {c.line}; predicted {c.predicted_speedup:.2f}× (error {c.error:+.1%})")
        lines.append(f"  speedup: median |error| {r['speedup_median_abs_error']:.1%}")
    return lines
