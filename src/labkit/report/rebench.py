"""Which k the concurrency re-bench (07) measures beside k = 0: a lookup, not a measurement.

A recipe that lists at most two nonzero k asks for exactly those. Otherwise the k sweep
(02) decides: its best n-gram k for the workload (greedy), the way ``advise`` reads it;
without a sweep, the median of the recipe's nonzero k, and the source says so.
"""

from __future__ import annotations

from labkit.errors import LabkitError
from labkit.report.queries import load_table, source_run

DRAFTER = "ngram"  # the multi-slot loop runs one n-gram drafter per stream


def spec_ks(c, recipe, workload: str) -> dict:
    """{"ks": [k, ...], "drafter", "source"}: the speculative k values to re-bench."""
    nonzero = sorted({k for k in recipe.k if k > 0})
    if not nonzero:
        return {"ks": [], "drafter": DRAFTER, "source": "recipe k lists no speculative k"}
    if len(nonzero) <= 2:
        return {"ks": nonzero, "drafter": DRAFTER, "source": "recipe k"}
    try:
        run, lab_id = source_run(c, "02_k_sweep", recipe)
        cells = load_table(c, run, "sweep-cells")
    except LabkitError:
        mid = nonzero[len(nonzero) // 2]
        return {"ks": [mid], "drafter": DRAFTER, "source": f"no k sweep: the median of the recipe's k ({mid})"}
    cells = cells[(cells["workload"] == workload) & (cells["temperature"] == 0) & (cells["k"] > 0)
                  & (cells["drafter"] == DRAFTER)]
    if cells.empty:
        mid = nonzero[len(nonzero) // 2]
        return {"ks": [mid], "drafter": DRAFTER,
                "source": f"{lab_id} has no {DRAFTER} cells for {workload}: the median of the recipe's k ({mid})"}
    top = cells.loc[cells["speedup"].idxmax()]
    return {"ks": [int(top["k"])], "drafter": DRAFTER, "source": f"{lab_id} (best {DRAFTER} k for {workload})"}
