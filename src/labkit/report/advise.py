"""Advice from logged measurements: the recommended (drafter, k) per workload, and
``advise --write``, which puts the protocol's winner into the recipe file beside its evidence.
"""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path

import pandas as pd

from labkit.errors import LabkitError
from labkit.provenance import tracking
from labkit.report.candidate import candidate  # noqa: F401 - the tool-suite candidate, re-exported
from labkit.report.queries import load_table, source_run


def advise(c, recipe, *, workload: str | None = None, temperature: float = 0.0) -> dict:
    """The recommended setting per workload from the newest k sweep: a lookup, not an opinion.

    A sweep that ran the search (02's ``protocol: search``) is read from its decisions: per
    workload on (the setting, its end-to-end ratio with its interval, the held-out check,
    the llama-server flags) or off, the mix, and where the chapter's ladder disagreed.

    A k is recommended only when its verdict is "wins" (its CI above 1 + the recipe's margin,
    judged at 1 - alpha/S for the S values of k it was picked from); "no measurable
    difference" recommends the simpler option, disable. Sweeps logged before verdicts had
    CIs (no per-generation rows) fall back to the best median above 1.0, and say so."""
    from labkit.analysis.sweep_tables import best_k, global_default

    run, lab_id = source_run(c, "02_k_sweep", recipe)
    if run.data.tags.get("search.decisions") and temperature == 0.0:
        return _search_advice(c, run, lab_id, recipe, workload)
    cells = load_table(c, run, "sweep-cells")
    cells = cells[cells["temperature"] == temperature]
    try:
        rows_tbl = load_table(c, run, "sweep-runs")
    except LabkitError:
        rows_tbl = None
    kw = {"margin": getattr(recipe, "decision_margin", 0.02), "confidence": getattr(recipe, "decision_confidence", 0.95)}
    best = _only(best_k(cells, rows=rows_tbl, **kw), workload, measured=cells["workload"])
    rows = []
    for wl, g in best.groupby("workload"):
        top = g.loc[g["best_spec_speedup"].idxmax()]  # the best drafter and k tested on this workload
        judged = top.get("verdict") is not None and top.get("verdict") == top.get("verdict")
        wins = top["verdict"] == "wins" if judged else top["best_spec_speedup"] > 1.0
        name = f"{top['drafter']} k={int(top['best_spec_k'])}"
        ci = (f"{kw['confidence']:.0%} CI {top['lo']:.2f}–{top['hi']:.2f}" if judged and top["hi"] < float("inf")
              else "one pair: no CI")
        line = (f"{name}: {top['best_spec_speedup']:.2f}× decode-only ({ci}, best of {int(top['candidates'])} k), "
                f"{top['verdict']}" if judged
                else f"{name}: {top['best_spec_speedup']:.2f}× decode-only (median; no CI: logged before verdicts)")
        rows.append({"workload": wl, "recommend": name if wins else "disable",
                     "drafter": top["drafter"], "k": int(top["best_spec_k"]) if wins else 0,
                     "speedup": float(top["best_spec_speedup"]) if wins else 1.0,
                     "best_tested": name, "best_tested_speedup": float(top["best_spec_speedup"]),
                     "verdict": top["verdict"] if judged else None, "line": line})
        rows[-1]["pairs"] = int(top["pairs"]) if judged and pd.notna(top.get("pairs")) else None
    glob = global_default(cells, rows=rows_tbl, **kw)
    tags = run.data.tags
    return {"recipe": recipe.name, "recipe_hash": recipe.hash, "source": lab_id, "temperature": temperature,
            "per_workload": rows, "global_default": glob.to_dict("records") if workload is None else None,
            # k: auto measured in the sweep: its verdict, and for llama-server users (who cannot run the
            # policy) the fixed flags closest to what it did
            "policy": ({"line": tags["policy.line"], "llama_server_flags": tags.get("policy.llama_server_flags")}
                       if tags.get("policy.line") else None)}


def _only(table, workload: str | None, *, measured):
    """``table``'s rows of ``workload`` (all rows when None); a workload the sweep did not
    measure is refused, naming those it did."""
    if not workload:
        return table
    hit = table[table["workload"] == workload]
    if hit.empty:
        raise LabkitError(f"the sweep has no workload {workload!r}",
                          f"measured: {', '.join(sorted(set(measured)))}")
    return hit


def setting_text(r: dict) -> str:
    """A workload's setting as the recipe's ``workload_settings`` writes it: "ngram k=5",
    "ngram k=auto" or "off"."""
    if r["k"] <= 0 or r.get("drafter") is None:
        return "off"
    if r.get("policy"):
        return f"{str(r['drafter']).split('+')[0]} k=auto"
    return f"{r['drafter']} k={int(r['k'])}"


def _search_advice(c, run, lab_id: str, recipe, workload: str | None) -> dict:
    """``advise`` from the search's decisions table (one row per workload)."""
    whole = load_table(c, run, "search-decisions")
    table = _only(whole, workload, measured=whole["workload"])
    from labkit.analysis.search import final_line

    rows = []
    for d in table.to_dict("records"):
        on = d["final"] == "on"
        d["check_inside"] = None if pd.isna(d.get("check_inside")) else bool(d["check_inside"])
        rows.append({"workload": d["workload"], "recommend": d["label"] if on else "disable",
                     "drafter": d["drafter"] if on else None, "k": int(d["k"]) if on else 0,
                     "policy": bool(d["policy"]) if on else False,
                     "speedup": float(d["ratio"]) if on else 1.0, "lo": d["lo"], "hi": d["hi"],
                     "verdict": d["verdict"], "best_tested": d["label"],
                     "best_tested_speedup": float(d["ratio"]) if d["ratio"] == d["ratio"] else None,
                     "check": d["check"], "llama_server": d["llama_server"] if on else None,
                     "line": final_line(d)})
    tags = run.data.tags
    return {"recipe": recipe.name, "recipe_hash": recipe.hash, "source": lab_id, "temperature": 0.0,
            "by": "search", "per_workload": rows, "global_default": None,
            "mix": tags.get("search.mix") if workload is None else None, "ladder": tags.get("search.ladder") or None,
            "policy": None}


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


# -- the protocol's winner: read it, use it as the candidate, write it back -------------
def protocol_winner(c, recipe) -> dict | None:
    """The stepwise protocol's winner in the sweep that ``recipe`` reads ({"drafter", "k",
    "source"}, plus the sweep's run and sweep hash), or None when that sweep ran the full grid."""
    run, lab_id = source_run(c, "02_k_sweep", recipe)
    tag = run.data.tags.get("protocol.winner")
    if not tag:
        return None
    return {**json.loads(tag), "sweep": lab_id, "run": run, "sweep_hash": run.data.tags.get("recipe.sweep_hash")}


def stale_fields(run, recipe) -> list[str]:
    """Sweep fields whose value in ``recipe`` differs from what the run was made with."""
    p = run.data.params
    out = []
    for f in recipe.SWEEP_FIELDS:
        raw = p.get(f) if p.get(f) not in (None, "null") else p.get(f"recipe.{f}")
        if raw is None or raw == "null":
            continue  # a notebook parameter left at None: its effective value is in the hash only
        if raw != tracking.param_text(getattr(recipe, f)):  # params are logged as param_text
            out.append(f"{f}: {raw} in the run, {json.dumps(getattr(recipe, f))} now")
    return out


def write_winner(c, recipe) -> dict:
    """Write the protocol's winner into the recipe file as ``n_max`` / ``n_max_drafter``, with
    the evidence's LAB ID in a comment beside it; every other line stays as it was.

    Refused (nothing written) when the recipe has no file, the file is read-only, the sweep
    ran the full grid, or the evidence is stale: the recipe's sweep fields changed since the
    run (its sweep hash differs).
    """
    from labkit.config import recipe as rc
    from labkit.config.recipe_edit import set_fields

    if not recipe.source:
        raise LabkitError("the recipe has no file to write to", "pass --recipe experiments/<name>.yaml")
    path = Path(recipe.source)
    if not os.access(path, os.W_OK) or not path.stat().st_mode & (stat.S_IWUSR | stat.S_IWGRP | stat.S_IWOTH):
        raise LabkitError(f"the recipe file {path} is read-only: nothing was written",
                          f"make it writable (chmod u+w {path}) or copy it to a new recipe, then retry")
    win = protocol_winner(c, recipe)
    if win is None:
        raise LabkitError(f"the newest 02_k_sweep of recipe {recipe.name} ran the full grid: there is no "
                          "protocol winner to write", f"run the stepwise protocol: labkit reproduce --recipe "
                          f"{recipe.name} --only 02_k_sweep -p protocol=stepwise")
    if win["sweep_hash"] != recipe.sweep_hash:
        changed = stale_fields(win["run"], recipe)
        raise LabkitError(
            f"stale evidence: {win['sweep']} was measured with other sweep fields than {path} now has "
            f"(sweep hash {win['sweep_hash']} vs {recipe.sweep_hash}): " + ("; ".join(changed) or "see the run"),
            f"rerun the sweep on the recipe as it is (labkit reproduce --recipe {recipe.name} --only 02_k_sweep), "
            "then write its winner")
    before = path.read_text()
    fields = {"n_max": int(win["k"]), "n_max_drafter": win["drafter"]}
    note = (f"[{win['source']}] stepwise protocol winner, written by labkit advise --write"
            if win["k"] > 0 else f"[{win['source']}] the protocol found no winning k: disable")
    if win.get("by") == "search":  # the search decides per workload: write each workload's setting too
        per = advise(c, recipe)["per_workload"]
        fields["workload_settings"] = {r["workload"]: setting_text(r) for r in per}
        note = f"[{win['source']}] the search's decisions, written by labkit advise --write"
    after = set_fields(before, fields, comment=note, where=str(path))
    path.write_text(after)
    try:
        check = rc.load(path)
        assert check.sweep_hash == recipe.sweep_hash, "writing n_max changed the sweep fields"
    except BaseException:
        path.write_text(before)  # never leave a recipe the next run cannot load
        raise
    changed = [(a, b) for a, b in zip(before.splitlines(), after.splitlines(), strict=False) if a != b]
    return {"written": str(path), **fields, "source": win["source"], "sweep": win["sweep"],
            "lines_changed": len(changed) + abs(len(after.splitlines()) - len(before.splitlines()))}
