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
    """keep / widen / narrow / disable for the best global default (greedy), with the
    inequality term behind the cells that lose.

    The default is the (drafter, k) with the best geometric-mean speedup over the
    workloads; "narrow" when some workloads lose at that k, "widen" when that k is the
    largest tested, "disable" when no default beats plain decoding.
    """
    from .sweep import geomean_by_k, global_default

    greedy = cells[cells["temperature"] == 0]
    glob = global_default(greedy)
    if glob.empty:
        return {"decision": NO_DATA.format(why="no speculative cells"), "term": None}
    top = glob.loc[glob["geomean_speedup"].idxmax()]
    drafter, gm = top["drafter"], float(top["geomean_speedup"])
    spec = greedy[(greedy["drafter"] == drafter) & (greedy["k"] > 0)]
    k = int(geomean_by_k(spec).idxmax())
    at_k = spec[spec["k"] == k].set_index("workload")["speedup"]
    winners, losers = sorted(at_k[at_k > 1].index), sorted(at_k[at_k <= 1].index)
    terms = []
    if pred is not None and not pred.empty:
        lose = pred[pred["losing_term"].notna() & (pred["drafter"] == drafter) & (pred["k"] == k)
                    & (pred["temperature"] == 0)]
        terms = [f"{r.workload} k={k}: {r.losing_term}" for r in lose.itertuples()]
        if gm <= 1 and not terms:
            lose = pred[pred["losing_term"].notna() & (pred["temperature"] == 0)]
            terms = [f"{r.drafter} {r.workload} k={r.k}: {r.losing_term}" for r in lose.head(1).itertuples()]
    if gm <= 1:
        decision = "disable: no drafter/k beats plain decoding across the workloads"
    elif losers:
        decision = (f"narrow: {drafter} k={k} for {', '.join(winners)}; disable (or rely on the gate) "
                    f"for {', '.join(losers)}")
    elif k == max(k_tested):
        decision = f"widen: {drafter} k={k} is the largest k tested; measure larger k"
    else:
        decision = f"keep: {drafter} at k={k}"
    return {"decision": decision, "best": {"drafter": drafter, "k": k, "geomean_speedup": gm,
                                           "per_workload": {w: float(v) for w, v in at_k.items()}},
            "term": "; ".join(terms) or None}


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
        best = d.get("best", {})
        add("n_max (best k)", f"{best['drafter']} k = {best['k']} (geometric-mean speedup {best['geomean_speedup']:.2f}× "
            "over the workloads)" if best else d["decision"], sid)
        rows = load_table(c, run, "sweep-runs")
        g = rows[(rows["drafter"] == best.get("drafter")) & (rows["k"] == best.get("k", -1)) & (~rows["cold"])
                 & (rows["temperature"] == 0)]
        add("mean accept length", f"{g['accepted'].sum() / g['spec_steps'].sum():.2f} accepted drafts per drafting "
                                  f"step; {g['decode_tokens'].sum() / g['steps'].sum():.2f} tokens per step "
                                  "(all steps, pooled over workloads)" if len(g) and g["spec_steps"].sum() else
            NO_DATA.format(why="no speculative run"), sid)
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
        top = g.loc[g["best_spec_speedup"].idxmax()]  # the best drafter and k tested on this workload
        wins = top["best_spec_speedup"] > 1.0
        rows.append({"workload": wl, "recommend": f"{top['drafter']} k={int(top['best_spec_k'])}" if wins else "disable",
                     "drafter": top["drafter"], "k": int(top["best_spec_k"]) if wins else 0,
                     "speedup": float(top["best_spec_speedup"]) if wins else 1.0,
                     "best_tested": f"{top['drafter']} k={int(top['best_spec_k'])}",
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
