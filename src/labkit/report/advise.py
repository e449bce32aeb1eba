"""Tables built from logged runs only: the results matrix, the accounting worksheet, advice.

Nothing here measures. Every number comes from a finished MLflow run, cited by its
``[LAB: …]`` ID; a field with no run behind it says so instead of holding a value.
"""

from __future__ import annotations

from labkit.errors import LabkitError
from labkit.report.queries import load_table, source_run


def advise(c, recipe, *, workload: str | None = None, temperature: float = 0.0) -> dict:
    """The recommended k per workload from the newest k sweep: a lookup, not an opinion."""
    from labkit.analysis.sweep_tables import best_k, global_default

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
