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
from labkit.provenance import arms as arm_journal
from labkit.provenance import fingerprint, runtags, tracking
from labkit.provenance import resume as resume_mod
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


def run_notebook(c, nb: Path, params: dict, out: Path, *, progress: Callable | None = None,
                 resume_from=None) -> dict:
    """Execute one notebook as one MLflow run; never raises for a failing notebook.
    ``resume_from`` (an interrupted MLflow run of this notebook) hands its arms on."""
    import papermill as pm

    recipe = effective_recipe(params)
    prov = fingerprint.collect(recipe=recipe)
    journal = out / f"{nb.stem}.cells.jsonl"
    tags = {**runtags.flat_tags(prov), "papermill.parameters": json.dumps(params, default=str),
            "lab.mode": "papermill", "lab.notebook": nb.stem, "lab.output": str(out),
            "recipe.effective_hash": recipe.hash, "recipe.sweep_hash": recipe.sweep_hash,
            "lab.pid": os.getpid(), "lab.journal": str(journal)}
    if resume_from is not None:
        tags.update({"resume.from": resume_from.data.tags.get("lab.id"), "resume.from_run_id": resume_from.info.run_id})
    rid, lab = tracking.new_run(c, notebook=nb.name, recipe=recipe, tags=tags,
                                run_name=f"{nb.stem} · {recipe.name}")
    tracking.log_json(c, rid, prov, "fingerprint.json")
    executed = out / nb.name
    env = {"LABKIT_RUN_ID": rid, "LABKIT_LAB_RUN": lab.run, "LABKIT_JOURNAL": str(journal),
           "LABKIT_NOTEBOOK": nb.stem, "MLFLOW_TRACKING_URI": tracking.tracking_uri(),
           "LABKIT_ROOT": str(project_root()),
           "LABKIT_RESUME_FROM": resume_from.info.run_id if resume_from is not None else ""}
    saved = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    status, error = "FINISHED", None
    t0 = time.perf_counter()
    if progress:
        progress(f"{nb.stem}: running as [{lab}]")
    interrupted = None
    try:
        with arm_journal.JournalWatcher(journal, progress or (lambda _m: None), label=f"{nb.stem}: "):
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
    done = c.get_run(rid).data.tags
    arms = {k[len("arms."):]: v for k, v in done.items() if k.startswith("arms.")}
    return {"notebook": nb.stem, "id": str(lab), "run_id": rid, "status": status, "error": error,
            "seconds": round(seconds, 1), "executed": str(executed), "produced": produced,
            "recipe": recipe.name, "recipe_hash": recipe.hash, "arms": arms,
            "resumed_from": done.get("resume.from")}


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
              params: dict | None = None, progress: Callable | None = None, resume: str | None = None,
              auto_resume: bool = True) -> dict:
    """Run the selected notebooks; returns the summary (also written to the output folder).

    ``resume`` (a LAB ID of an interrupted run) continues it: its notebook (unless ``only``
    says otherwise), its parameters (``recipe``/``params`` override them), its arms kept.
    ``auto_resume`` continues, for each notebook, the newest run of the same notebook,
    effective recipe and commit when it was interrupted (see ``provenance.resume``)."""
    c = tracking.client() if resume else None
    source = resume_mod.source_for(c, resume) if resume else None
    if source is not None:
        prev = json.loads(source.data.tags.get("papermill.parameters", "{}"))
        params = {**prev, **({"recipe": recipe} if recipe else {}), **(params or {})}
        recipe = params.pop("recipe", None)
        only = only or [source.data.tags["lab.notebook"]]
    base = {"recipe": recipe or "default", **(params or {})}
    eff = effective_recipe(base)
    nbs = discover(only, eff)
    routed = route_parameters(nbs, base)  # refuse bad input before anything runs or is recorded
    c = c or tracking.client()
    sources = _resume_sources(c, nbs, routed, source, auto_resume, progress)
    stamp = time.strftime("%Y%m%d-%H%M%S")
    out = Path(out_dir) if out_dir else project_root() / "runs" / f"{stamp}-{eff.name}"
    out.mkdir(parents=True, exist_ok=True)
    results = []
    for nb in nbs:
        res = run_notebook(c, nb, routed[nb], out, progress=progress, resume_from=sources.get(nb.stem))
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


def _resume_sources(c, nbs: list[Path], routed: dict, source, auto: bool, progress) -> dict:
    """notebook stem -> the interrupted run it continues, each checked before anything runs."""
    commit = fingerprint.git_info()["commit"]
    out = {}
    if source is not None:
        stem = source.data.tags.get("lab.notebook")
        if stem not in {nb.stem for nb in nbs}:
            raise LabkitError(f"--resume names a run of {stem}, which is not among the notebooks to run",
                              f"drop --only, or add --only {stem}")
        out[stem] = source
    for nb in nbs:
        if nb.stem not in out and auto:
            found = resume_mod.newest_interrupted(c, nb.stem, recipe_hash=effective_recipe(routed[nb]).hash,
                                                  commit=commit)
            if found is not None:
                out[nb.stem] = found
    for nb in nbs:
        if nb.stem in out:
            run = out[nb.stem]
            resume_mod.check(run, resume_mod.identity(effective_recipe(routed[nb]), commit=commit))
            if run.info.status == "RUNNING":  # its writer is gone (resume.interrupted): close it
                c.set_tag(run.info.run_id, "lab.error", "its process was gone; resumed by a new run")
                c.set_terminated(run.info.run_id, "KILLED")
            if progress:
                progress(f"{nb.stem}: resuming [{run.data.tags.get('lab.id')}] ({run.info.status}, "
                         f"{resume_mod.arms_done(run)} arms kept)" + ("" if run is source else
                                                               " by default; --no-resume starts afresh"))
    return out
