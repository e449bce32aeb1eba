"""Tables built from logged runs only: the results matrix, the accounting worksheet, advice.

Nothing here measures. Every number comes from a finished MLflow run, cited by its
``[LAB: …]`` ID; a field with no run behind it says so instead of holding a value.
"""

from __future__ import annotations

import json

import pandas as pd

from labkit.errors import LabkitError
from labkit.provenance.metric_keys import canonical_metrics
from labkit.report.queries import NO_DATA, latest_runs, load_table


def decide(cells: pd.DataFrame, pred: pd.DataFrame | None, k_tested: list[int]) -> dict:
    """keep / widen / narrow / disable for the best global default (greedy), with the
    inequality term behind the cells that lose.

    The default is the (drafter, k) with the best geometric-mean speedup over the
    workloads; "narrow" when some workloads lose at that k, "widen" when that k is the
    largest tested, "disable" when no default beats plain decoding.
    """
    from labkit.analysis.sweep_tables import geomean_by_k, global_default

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
        m = canonical_metrics(cost[0].data.metrics)
        add("verify(m) fit", f"a = {m.get('verify/a_ms', float('nan')):.2f} ms, b = {m.get('verify/b_ms', float('nan')):.2f} "
                             f"ms/row, H = {m.get('verify/H_ms', float('nan')):.2f} ms", cost[0].data.tags.get("lab.id"))
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
        m = canonical_metrics(tools[0].data.metrics)
        on = ", ".join(f"{k.rsplit('.', 1)[-1]} {v:.3f}" for k, v in sorted(m.items())
                       if k.startswith("toolsuite/greedy.on.") and not k.endswith((".lo", ".hi")))
        verdicts = json.loads(tools[0].data.tags.get("toolsuite.verdict", "{}"))
        add("tool-suite runs", f"greedy off {m.get('toolsuite/greedy.off', float('nan')):.3f}, on: {on}; sampled: "
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
