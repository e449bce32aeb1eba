"""The candidate: the one (drafter, n_max) that the tool suite and the worksheets judge.

In order: an explicit ``toolsuite_k`` override (``-p toolsuite_k=…``); the recipe's
``n_max`` (and ``n_max_drafter``), which ``labkit advise --write`` puts there from the
evidence; the stepwise protocol's winner from the newest sweep (its ``protocol.winner``
tag; when it found none, its first measured step, so that the reject is shown and
judged); the best global default of the newest sweep
(the k with the best geometric-mean speedup over the workloads, greedy). With no sweep
at all, the recipe's ``toolsuite_k``. The answer always says which rule chose it and
which run (or file) backs it.
"""

from __future__ import annotations

from labkit.report import evidence


def candidate(c, recipe, sweep: evidence.Sweep | None = None) -> dict:
    """{"drafter", "k", "how", "source"} for ``recipe``; ``sweep`` saves a second lookup."""
    first = recipe.drafters[0] if recipe.drafters else "ngram"
    if "toolsuite_k" in recipe.origins:
        return _with_why({"drafter": first, "k": int(recipe.toolsuite_k),
                          "how": f"toolsuite_k set by {recipe.origins['toolsuite_k']}", "source": None})
    n_max = getattr(recipe, "n_max", None)
    if n_max is not None:
        d = getattr(recipe, "n_max_drafter", None) or first
        return _with_why({"drafter": d, "k": int(n_max), "how": f"the recipe's n_max = {n_max} ({d})",
                          "source": f"recipe n_max ({recipe.source or recipe.name})"})
    sw = sweep if sweep is not None else evidence.sweep(c, recipe)
    if sw.winner and sw.winner.get("k") is not None:
        src = sw.winner.get("source") or sw.id
        if int(sw.winner["k"]) > 0:
            how = ("the search's fastest fixed setting turned on (each workload's own: item 7)"
                   if sw.winner.get("by") == "search" else "the stepwise protocol's winner")
            return _with_why({"drafter": sw.winner.get("drafter") or first, "k": int(sw.winner["k"]),
                              "how": f"{how} [{src}]", "source": src})
        lost = first_loss(sw.steps)
        if lost is not None:  # no winner: judge the first step the protocol measured, so the reject is shown
            return _with_why({"drafter": lost["drafter"], "k": lost["k"], "source": src,
                              "how": f"the protocol's first measured step ({lost['why']}), judged because the "
                                     f"protocol found no winning n_max [{src}]"})
    if sw.cells is not None:
        best = best_default(sw.cells)
        if best is not None:
            return _with_why({**best, "how": "the best global default of the newest sweep (geometric mean over "
                                             "workloads)", "source": sw.id})
    return _with_why({"drafter": first, "k": int(recipe.toolsuite_k),
                      "how": f"the recipe's toolsuite_k ({sw.why or 'the sweep has no speculative cells'})",
                      "source": None})


def _with_why(c: dict) -> dict:
    """Notebooks print "why" (how, then its source unless how cites it already); worksheets cite "how"."""
    src = c.get("source")
    return {**c, "why": c["how"] if not src or str(src) in c["how"] else f"{c['how']} [{src}]"}


def first_loss(steps) -> dict | None:
    """The measured step, at the smallest k, with the best end-to-end speedup: what the
    protocol would have turned on had it won (None without a protocol-steps table)."""
    if steps is None or steps.empty:
        return None
    measured = steps[steps["measured"].fillna(True).astype(bool)] if "measured" in steps else steps
    measured = measured[(measured["k"] > 0) & (measured["drafter"] != "aa")]
    if measured.empty:
        return None
    at = measured[measured["k"] == measured["k"].min()]
    top = at.loc[at["e2e_speedup"].astype(float).idxmax()]
    why = str(top.get("stop_reason") or "stopped").split(";")[0]
    return {"drafter": str(top["drafter"]), "k": int(top["k"]),
            "why": why.split(": ")[0] if top.get("verdict") else why}  # the verdict's line is in its own cell


def best_default(cells) -> dict | None:
    """The greedy (drafter, k) with the best geometric-mean speedup, winning or not."""
    from labkit.analysis.sweep_tables import geomean_by_k

    spec = cells[(cells["temperature"] == 0) & (cells["k"] > 0)]
    if spec.empty:
        return None
    best = None
    for d, g in spec.groupby("drafter"):
        gm = geomean_by_k(g)
        k = int(gm.idxmax())
        if best is None or gm.max() > best["geomean_speedup"]:
            best = {"drafter": d, "k": k, "geomean_speedup": float(gm.max())}
    return best
