"""``labkit reproduce``: run the notebooks under papermill, each as one logged MLflow run.

Suitable for cron: every run goes to a timestamped folder (executed notebooks, cell
journals, a summary), the IDs produced are printed, the exit status is non-zero when
any notebook failed, and a failed run is marked FAILED in MLflow with everything it
recorded before the failure kept. Each run is compared with the previous finished run
of the same notebook and effective recipe; metrics that moved beyond their recorded
noise are flagged.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable
from pathlib import Path

from labkit.config.recipe import effective_recipe
from labkit.errors import LabkitError
from labkit.paths import project_root
from labkit.provenance import fingerprint, runtags, tracking
from labkit.provenance.drift import compare_with_previous


def notebooks_dir() -> Path:
    """``$LABKIT_NOTEBOOKS`` or the project's notebooks/."""
    env = os.environ.get("LABKIT_NOTEBOOKS")
    return Path(env) if env else project_root() / "notebooks"


def discover(only: list[str] | None = None, recipe=None) -> list[Path]:
    """The notebooks to run: ``NN_name.ipynb`` in order, filtered by --only or the recipe."""
    all_nb = sorted(p for p in notebooks_dir().glob("[0-9][0-9]_*.ipynb"))
    wanted = only or (recipe.notebooks if recipe is not None and recipe.notebooks else None)
    if not wanted:
        return all_nb
    out = []
    for w in wanted:
        hits = [p for p in all_nb if p.stem == w or p.stem.startswith(w) or p.stem.split("_", 1)[-1] == w]
        if not hits:
            raise LabkitError(f"no notebook matches {w!r}", f"available: {', '.join(p.stem for p in all_nb)}")
        out += [h for h in hits if h not in out]
    return out


def declared_parameters(nb: Path) -> dict:
    """The notebook's parameters cell, or a clear error when it has none."""
    import papermill as pm

    declared = pm.inspect_notebook(str(nb))
    if not declared:
        raise LabkitError(
            f"{nb.name} has no cell tagged 'parameters'",
            "tag the notebook's first code cell 'parameters' (JupyterLab: property inspector > cell tags)",
        )
    return declared


def route_parameters(nbs: list[Path], params: dict) -> dict[Path, dict]:
    """Which parameters go to which notebook. Papermill would only warn about a parameter a
    notebook does not declare; we refuse: with one notebook, any undeclared parameter; with
    several, a parameter that none of them declares (the others get only what they declare)."""
    declared = {nb: declared_parameters(nb) for nb in nbs}
    for name in params:
        if not any(name in d for d in declared.values()):
            names = sorted({n for d in declared.values() for n in d})
            where = nbs[0].name if len(nbs) == 1 else f"any of {', '.join(nb.stem for nb in nbs)}"
            raise LabkitError(
                f"parameter {name!r} is not declared by {where}",
                f"declared parameters: {', '.join(names)}; add it to the parameters cell or drop it",
            )
    return {nb: {k: v for k, v in params.items() if k in declared[nb]} for nb in nbs}


def run_notebook(c, nb: Path, params: dict, out: Path, *, progress: Callable | None = None) -> dict:
    """Execute one notebook as one MLflow run; never raises for a failing notebook."""
    import papermill as pm

    recipe = effective_recipe(params)
    prov = fingerprint.collect(recipe=recipe)
    tags = {**runtags.flat_tags(prov), "papermill.parameters": json.dumps(params, default=str),
            "lab.mode": "papermill", "lab.notebook": nb.stem, "lab.output": str(out),
            "recipe.effective_hash": recipe.hash, "recipe.sweep_hash": recipe.sweep_hash}
    rid, lab = tracking.new_run(c, notebook=nb.name, recipe=recipe, tags=tags,
                                run_name=f"{nb.stem} · {recipe.name}")
    tracking.log_json(c, rid, prov, "fingerprint.json")
    journal = out / f"{nb.stem}.cells.jsonl"
    executed = out / nb.name
    env = {"LABKIT_RUN_ID": rid, "LABKIT_LAB_RUN": lab.run, "LABKIT_JOURNAL": str(journal),
           "LABKIT_NOTEBOOK": nb.stem, "MLFLOW_TRACKING_URI": tracking.tracking_uri(),
           "LABKIT_ROOT": str(project_root())}
    saved = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    status, error = "FINISHED", None
    t0 = time.perf_counter()
    if progress:
        progress(f"{nb.stem}: running as [{lab}]")
    interrupted = None
    try:
        pm.execute_notebook(str(nb), str(executed), parameters=params, progress_bar=False,
                            cwd=str(nb.parent), kernel_name="python3")
    except pm.PapermillExecutionError as e:
        status, error = "FAILED", f"cell {e.exec_count}: {e.ename}: {e.evalue}"
    except Exception as e:  # kernel death, missing kernel, ...: the run is still closed as FAILED
        status, error = "FAILED", f"{type(e).__name__}: {e}"
    except BaseException as e:  # Ctrl-C / SIGTERM: close the run as KILLED, keep its records, re-raise
        status, error, interrupted = "KILLED", f"interrupted ({type(e).__name__})", e
    finally:
        for k, v in saved.items():
            os.environ.pop(k) if v is None else os.environ.__setitem__(k, v)
    seconds = time.perf_counter() - t0
    try:
        if executed.exists():
            c.log_artifact(rid, str(executed), "notebook")
        if journal.exists():
            c.log_artifact(rid, str(journal), "notebook")
        c.set_tag(rid, "lab.status", status)
        if error:
            c.set_tag(rid, "lab.error", error[:5000])
        c.log_metric(rid, "lab.seconds", seconds)
    finally:
        c.set_terminated(rid, status)
    if interrupted is not None:
        raise interrupted
    produced = _produced(journal)
    if progress:
        progress(f"{nb.stem}: {status} in {seconds:.0f} s" + (f" ({error})" if error else ""))
    return {"notebook": nb.stem, "id": str(lab), "run_id": rid, "status": status, "error": error,
            "seconds": round(seconds, 1), "executed": str(executed), "produced": produced,
            "recipe": recipe.name, "recipe_hash": recipe.hash}


def _produced(journal: Path) -> list[dict]:
    if not journal.exists():
        return []
    out = []
    for line in journal.read_text().splitlines():
        r = json.loads(line)
        if r["type"] in ("figure", "table"):
            out.append({"id": r["id"], "type": r["type"], "name": r["name"]})
        elif r["type"] == "cell":
            out.append({"id": r["id"], "type": "cell", "status": r["status"]})
    return out


SWEEP_NOTEBOOK = "02_k_sweep"


def reproduce(*, recipe: str | None = None, only: list[str] | None = None, out_dir: str | None = None,
              params: dict | None = None, progress: Callable | None = None) -> dict:
    """Run the selected notebooks; returns the summary (also written to the output folder)."""
    base = {"recipe": recipe or "default", **(params or {})}
    eff = effective_recipe(base)
    nbs = discover(only, eff)
    routed = route_parameters(nbs, base)  # refuse bad input before anything runs or is recorded
    c = tracking.client()
    stamp = time.strftime("%Y%m%d-%H%M%S")
    out = Path(out_dir) if out_dir else project_root() / "runs" / f"{stamp}-{eff.name}"
    out.mkdir(parents=True, exist_ok=True)
    results = []
    for nb in nbs:
        res = run_notebook(c, nb, routed[nb], out, progress=progress)
        if res["status"] == "FINISHED":
            res["comparison"] = compare_with_previous(c, res)
            if nb.stem == SWEEP_NOTEBOOK:  # later notebooks read exactly this sweep
                for later in nbs[nbs.index(nb) + 1:]:
                    if "sweep" in declared_parameters(later) and "sweep" not in base:
                        routed[later]["sweep"] = res["id"]
        results.append(res)
        (out / "summary.json").write_text(json.dumps({"results": results}, indent=1, default=str))
    ok = all(r["status"] == "FINISHED" for r in results)
    summary = {"ok": ok, "output": str(out), "tracking_uri": tracking.tracking_uri(), "recipe": eff.name,
               "recipe_hash": eff.hash, "results": results}
    (out / "summary.json").write_text(json.dumps(summary, indent=1, default=str))
    return summary
