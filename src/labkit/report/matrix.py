"""Tables built from logged runs only: the results matrix, the accounting worksheet, advice.

Nothing here measures. Every number comes from a finished MLflow run, cited by its
``[LAB: …]`` ID; a field with no run behind it says so instead of holding a value.
"""

from __future__ import annotations

import json

import pandas as pd

from labkit.errors import LabkitError
from labkit.report.queries import NO_DATA, latest_per_recipe, load_table, run_host


def _cell_text(row) -> str:
    acc = f"{row['acceptance']:.0%}" if row.get("acceptance") is not None and pd.notna(row["acceptance"]) else "-"
    return f"{row['tok_s']:.1f} ({row['speedup']:.2f}×) @ {acc}"


def _busy(tags: dict) -> str:
    """How busy the box was while the sweep measured (``machine.*`` tags of the run)."""
    if tags.get("machine.busy") is None:
        return "not recorded"
    text = f"{float(tags['machine.busy']):.0%} by others"
    return text + ", CONTENDED" if tags.get("machine.contended") == "true" else text


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
        spill = res.get("label") or NO_DATA.format(why="the engine did not report residency (an older run)")
        agg = cells.groupby(["drafter", "k"]).agg(tok_s=("tok_s", "median"), speedup=("speedup", "median"),
                                                   acceptance=("acceptance", "median")).reset_index()
        base = agg[agg["k"] == 0]["tok_s"].median()
        for d in sorted(x for x in agg["drafter"].unique() if x != "none"):
            row = {"recipe": tags.get("recipe"), "host": run_host(run), "model": tags.get("model.name"),
                   "model_sha256": (tags.get("model.sha256") or "")[:12], "spill": spill, "drafter": d,
                   "baseline tok/s": round(float(base), 1), "id": tags.get("lab.id"),
                   "box busy": _busy(tags)}
            for r in agg[agg["drafter"] == d].to_dict("records"):
                row[f"k={int(r['k'])}"] = _cell_text(r)
            rows.append(row)
    if not rows:
        raise LabkitError("no finished 02_k_sweep runs to build the results matrix from",
                          "run `labkit reproduce --only 02_k_sweep` first")
    return pd.DataFrame(rows)
