"""Tables built from logged runs only: the results matrix, the accounting worksheet, advice.

Nothing here measures. Every number comes from a finished MLflow run, cited by its
``[LAB: …]`` ID; a field with no run behind it says so instead of holding a value.
"""

from __future__ import annotations

import json

import pandas as pd

from . import figures, tracking
from .errors import LabkitError

NO_DATA = "no data: {why}"


def latest_runs(c, notebook: str, *, recipe_hash: str | None = None, sweep_hash: str | None = None,
                recipe_name: str | None = None, limit: int = 200) -> list:
    """Finished runs of a notebook, newest first; optionally of one recipe (by effective
    hash, by the hash of its sweep fields, or by name)."""
    exp = c.get_experiment_by_name(notebook)
    if exp is None:
        return []
    flt = "attributes.status = 'FINISHED'"
    if recipe_hash:
        flt += f" and tags.`recipe.effective_hash` = '{recipe_hash}'"
    if sweep_hash:
        flt += f" and tags.`recipe.sweep_hash` = '{sweep_hash}'"
    if recipe_name:
        flt += f" and tags.`recipe` = '{recipe_name}'"
    return list(c.search_runs([exp.experiment_id], filter_string=flt, order_by=["attributes.start_time DESC"],
                              max_results=limit))


def latest_per_recipe(c, notebook: str) -> list:
    seen, out = set(), []
    for r in latest_runs(c, notebook):
        h = r.data.tags.get("recipe.effective_hash")
        if h not in seen:
            seen.add(h)
            out.append(r)
    return out


def load_table(c, run, name: str) -> pd.DataFrame:
    """A table a notebook logged with ``lab.table`` (exact data)."""
    return figures.frame_from_json(tracking.read_artifact(c, run.info.run_id, f"tables/{name}/data.json"))


def source_run(c, notebook: str, recipe) -> tuple:
    """The newest finished run of ``notebook`` with this recipe's sweep fields, or a clear error."""
    runs = latest_runs(c, notebook, sweep_hash=recipe.sweep_hash)
    if not runs:
        raise LabkitError(
            f"no finished {notebook} run for recipe {recipe.name} (sweep fields hash {recipe.sweep_hash}) "
            f"in {tracking.tracking_uri()}",
            f"run it first with the same sweep settings: labkit reproduce --recipe {recipe.name} --only {notebook}",
        )
    return runs[0], runs[0].data.tags.get("lab.id")


def _cell_text(row) -> str:
    acc = f"{row['acceptance']:.0%}" if row.get("acceptance") is not None and pd.notna(row["acceptance"]) else "-"
    return f"{row['tok_s']:.1f} ({row['speedup']:.2f}×) @ {acc}"


def results_matrix(c, *, workload: str = "all", temperature: float = 0.0) -> pd.DataFrame:
    """The §E table: one row per recipe/model/drafter; baseline tok/s and one column per k,
    each "tok/s (speedup×) @ acceptance%", from the newest k-sweep run of each recipe."""
    rows = []
    for run in latest_per_recipe(c, "02_k_sweep"):
        cells = load_table(c, run, "sweep-cells")
        cells = cells[cells["temperature"] == temperature]
        if workload != "all":
            cells = cells[cells["workload"] == workload]
        if cells.empty:
            continue
        tags = run.data.tags
        res = json.loads(tags.get("residency", "null") or "null") or {}
        spill = ("none: all on host" if res.get("layers_on_accelerator", 0) == 0 else
                 f"{res.get('layers_on_host')} of {res.get('layers_on_host', 0) + res.get('layers_on_accelerator', 0)} "
                 "layers on host")
        agg = cells.groupby(["drafter", "k"]).agg(tok_s=("tok_s", "median"), speedup=("speedup", "median"),
                                                   acceptance=("acceptance", "median")).reset_index()
        base = agg[agg["k"] == 0]["tok_s"].median()
        for d in sorted(x for x in agg["drafter"].unique() if x != "none"):
            row = {"recipe": tags.get("recipe"), "model": tags.get("model.name"),
                   "model_sha256": (tags.get("model.sha256") or "")[:12], "spill": spill, "drafter": d,
                   "baseline tok/s": round(float(base), 1), "id": tags.get("lab.id")}
            for r in agg[agg["drafter"] == d].to_dict("records"):
                row[f"k={int(r['k'])}"] = _cell_text(r)
            rows.append(row)
    if not rows:
        raise LabkitError("no finished 02_k_sweep runs to build the results matrix from",
                          "run `labkit reproduce --only 02_k_sweep` first")
    return pd.DataFrame(rows)


def decide(cells: pd.DataFrame, pred: pd.DataFrame | None, k_tested: list[int]) -> dict:
    """keep / widen / narrow / disable, with the inequality term behind it."""
    spec = cells[(cells["k"] > 0) & (cells["temperature"] == 0)]
    if spec.empty:
        return {"decision": NO_DATA.format(why="no speculative cells"), "term": None}
    best = spec.loc[spec["speedup"].idxmax()]
    per_wl = spec.groupby("workload")["speedup"].max()
    winners = sorted(per_wl[per_wl > 1].index)
    losers = sorted(per_wl[per_wl <= 1].index)
    term = None
    if pred is not None and not pred.empty:
        lose = pred[(pred["losing_term"].notna()) & (pred["drafter"] == best["drafter"])]
        if not lose.empty:
            term = lose.iloc[0]["losing_term"]
    if best["speedup"] <= 1:
        decision = "disable: no drafter/k beats plain decoding"
    elif losers:
        decision = f"narrow: enable for {', '.join(winners)}; disable (or gate) for {', '.join(losers)}"
    elif int(best["k"]) == max(k_tested):
        decision = f"widen: best k = {int(best['k'])} is the largest tested; try larger k"
    else:
        decision = f"keep: {best['drafter']} at k = {int(best['k'])}"
    return {"decision": decision, "best": {"drafter": best["drafter"], "k": int(best["k"]),
                                           "speedup": float(best["speedup"])}, "term": term}


def worksheet(c, recipe) -> list[dict]:
    """The accounting worksheet for one recipe, every field from a cited run or marked as missing."""
    fields: list[dict] = []

    def add(name, value, source=None):
        fields.append({"field": name, "value": value, "source": source})

    sweep = latest_runs(c, "02_k_sweep", sweep_hash=recipe.sweep_hash)
    cost = latest_runs(c, "01_cost_fit", recipe_name=recipe.name)
    tools = latest_runs(c, "04_tool_suite_qc", recipe_name=recipe.name)
    power = latest_runs(c, "05_power", recipe_name=recipe.name)
    ref = (sweep or cost or [None])[0]
    if ref is None:
        add("engine build", NO_DATA.format(why=f"no run for recipe {recipe.name}; run labkit reproduce"))
        return fields
    t = ref.data.tags
    rid = t.get("lab.id")
    add("engine build", f"{t.get('engine')} {t.get('engine.version')} (llama.cpp {str(t.get('engine.commit'))[:10]}), "
                        f"flags: {t.get('engine.flags')}", rid)
    add("model artifact + checksum", f"{t.get('model.name')} sha256 {t.get('model.sha256')}", rid)
    add("spill / residency", t.get("residency") or NO_DATA.format(why="engine did not report residency"), rid)
    if cost:
        m = cost[0].data.metrics
        add("verify(m) fit", f"a = {m.get('verify_a_ms', float('nan')):.2f} ms, b = {m.get('verify_b_ms', float('nan')):.2f} "
                             f"ms/row, H = {m.get('H_ms', float('nan')):.2f} ms", cost[0].data.tags.get("lab.id"))
    else:
        add("verify(m) fit", NO_DATA.format(why="no 01_cost_fit run"))
    if sweep:
        run = sweep[0]
        sid = run.data.tags.get("lab.id")
        cells = load_table(c, run, "sweep-cells")
        try:
            pred = load_table(c, run, "cost-model")
        except LabkitError:
            pred = None
        base = cells[(cells["k"] == 0) & (cells["temperature"] == 0)]
        d = decide(cells, pred, sorted(int(k) for k in cells["k"].unique()))
        add("n_max (best k)", f"{d['best']['drafter']} k = {d['best']['k']} ({d['best']['speedup']:.2f}× median)"
            if "best" in d else d["decision"], sid)
        g = cells[(cells["k"] == d.get("best", {}).get("k", -1)) & (cells["drafter"] == d.get("best", {}).get("drafter"))]
        add("mean accept length", f"{g['mean_accepted'].median():.2f} accepted drafts per step "
                                  f"({g['tokens_per_step'].median():.2f} tokens per step)" if not g.empty else
            NO_DATA.format(why="no speculative cell"), sid)
        add("warm decode tok/s (plain)", f"{base['tok_s'].median():.1f} (range {base['tok_s_min'].min():.1f}-"
                                         f"{base['tok_s_max'].max():.1f}, {int(base['n'].sum())} warm runs)", sid)
        add("decision", d["decision"], sid)
        add("dominant inequality term", d["term"] or "no losing cell for the chosen drafter", sid)
    else:
        for f in ("n_max (best k)", "mean accept length", "warm decode tok/s (plain)", "decision",
                  "dominant inequality term"):
            add(f, NO_DATA.format(why="no 02_k_sweep run"))
    if tools:
        m = tools[0].data.metrics
        on = ", ".join(f"{k.rsplit('.', 1)[-1]} {v:.3f}" for k, v in sorted(m.items())
                       if k.startswith("toolsuite.greedy.on.") and not k.endswith((".lo", ".hi")))
        verdicts = json.loads(tools[0].data.tags.get("toolsuite.verdict", "{}"))
        add("tool-suite runs", f"greedy off {m.get('toolsuite.greedy.off', float('nan')):.3f}, on: {on}; sampled: "
            + "; ".join(f"{d}: {v}" for d, v in verdicts.items()), tools[0].data.tags.get("lab.id"))
    else:
        add("tool-suite runs", NO_DATA.format(why="no 04_tool_suite_qc run"))
    add("concurrency measured", NO_DATA.format(why="labkit measures single-stream decoding only"))
    if power:
        p = power[0]
        add("energy per token", p.data.tags.get("power.summary", NO_DATA.format(why="no summary")), p.data.tags.get("lab.id"))
    else:
        add("energy per token", NO_DATA.format(why="no 05_power run"))
    return fields


def advise(c, recipe, *, workload: str | None = None, temperature: float = 0.0) -> dict:
    """The recommended k per workload from the newest k sweep: a lookup, not an opinion."""
    from .sweep import best_k, global_default

    run, lab_id = source_run(c, "02_k_sweep", recipe)
    cells = load_table(c, run, "sweep-cells")
    cells = cells[cells["temperature"] == temperature]
    best = best_k(cells)
    if workload:
        best = best[best["workload"] == workload]
        if best.empty:
            raise LabkitError(f"the sweep has no workload {workload!r}",
                              f"measured: {', '.join(sorted(cells['workload'].unique()))}")
    rows = []
    for wl, g in best.groupby("workload"):
        top = g.loc[g["speedup"].idxmax()]
        rows.append({"workload": wl, "recommend": "disable" if top["best_k"] == 0 else
                     f"{top['drafter']} k={int(top['best_k'])}", "drafter": top["drafter"],
                     "k": int(top["best_k"]), "speedup": float(top["speedup"]),
                     "best_tested_speedup": float(top["best_spec_speedup"])})
    glob = global_default(cells)
    return {"recipe": recipe.name, "recipe_hash": recipe.hash, "source": lab_id, "temperature": temperature,
            "per_workload": rows, "global_default": glob.to_dict("records") if workload is None else None}


def best_for(c, recipe, workload: str) -> dict:
    """The best (drafter, k) measured for one workload in the newest sweep (greedy), with its source ID.

    Where nothing beats plain decoding, the best speculative k is still returned (flagged),
    so that a power run can show what speculation would cost.
    """
    res = advise(c, recipe, workload=workload)
    row = res["per_workload"][0]
    run, _ = source_run(c, "02_k_sweep", recipe)
    best = load_table(c, run, "sweep-cells")
    cells = best[(best["workload"] == workload) & (best["temperature"] == 0) & (best["k"] > 0)]
    top = cells.loc[cells["speedup"].idxmax()]
    return {"drafter": top["drafter"], "k": int(top["k"]), "speedup": float(top["speedup"]),
            "wins": row["k"] > 0, "source": res["source"]}
