"""Tables built from logged runs only: the results matrix, the accounting worksheet, advice.

Nothing here measures. Every number comes from a finished MLflow run, cited by its
``[LAB: …]`` ID; a field with no run behind it says so instead of holding a value.
"""

from __future__ import annotations

import json

import pandas as pd

from labkit.errors import LabkitError
from labkit.provenance import fingerprint, frames, tracking
from labkit.provenance.ids import parse_id
from labkit.provenance.runtags import machine_of

NO_DATA = "no data: {why}"


THIS_HOST = "this host"  # latest_runs(host=THIS_HOST): the label of the machine asking


def run_host(run) -> str | None:
    """The host label a run was made on (runs from before labels: their hostname)."""
    return machine_of(run.data.tags)[0]


def run_build(run) -> str | None:
    """The engine build a run used (``engine.build``), None for runs that opened no engine."""
    return machine_of(run.data.tags)[1]


def latest_runs(c, notebook: str, *, recipe_hash: str | None = None, sweep_hash: str | None = None,
                recipe_name: str | None = None, host: str | None = THIS_HOST, engine_build: str | None = None,
                limit: int = 200) -> list:
    """Finished runs of a notebook, newest first; optionally of one recipe (by effective
    hash, by the hash of its sweep fields, or by name).

    "Latest" is per host: by default only runs made on this machine's host label
    (``LABKIT_HOST_LABEL``, else the hostname) count, so a Mac run never stands in for a
    Linux run; ``host=None`` takes every host, ``engine_build`` narrows to one build."""
    exp = tracking.get_experiment(c, notebook)
    if exp is None:
        return []
    flt = "attributes.status = 'FINISHED'"
    if recipe_hash:
        flt += f" and tags.`recipe.effective_hash` = '{recipe_hash}'"
    if sweep_hash:
        flt += f" and tags.`recipe.sweep_hash` = '{sweep_hash}'"
    if recipe_name:
        flt += f" and tags.`recipe` = '{recipe_name}'"
    runs = c.search_runs([exp.experiment_id], filter_string=flt, order_by=["attributes.start_time DESC"],
                         max_results=limit)
    if host == THIS_HOST:
        host = fingerprint.host_label()[0]
    return [r for r in runs if (host is None or run_host(r) == host)
            and (engine_build is None or run_build(r) == engine_build)]


def latest_per_recipe(c, notebook: str) -> list:
    """The newest finished run of each (recipe, host label, engine build), every host."""
    seen, out = set(), []
    for r in latest_runs(c, notebook, host=None):
        key = (r.data.tags.get("recipe.effective_hash"), run_host(r), run_build(r))
        if key not in seen:
            seen.add(key)
            out.append(r)
    return out


def load_table(c, run, name: str) -> pd.DataFrame:
    """A table a notebook logged with ``lab.table`` (exact data)."""
    return frames.frame_from_json(tracking.read_artifact(c, run.info.run_id, f"tables/{name}/data.json"))


def source_run(c, notebook: str, recipe) -> tuple:
    """The run of ``notebook`` (the k sweep) that downstream notebooks and ``advise`` read.

    ``recipe.sweep`` (a LAB ID) names it exactly. Otherwise: the newest finished run with
    this recipe's sweep fields, else the newest finished run of the same recipe name (so
    ``-p runs=1`` on a downstream notebook does not orphan it); which one was taken is
    in the returned ID's run tags (``lab.sweep_match``).
    """
    if getattr(recipe, "sweep", None):
        lid = parse_id(recipe.sweep)
        run = tracking.find_run(c, lid.run)
        exp = c.get_experiment(run.info.experiment_id).name
        if not exp.endswith(notebook):
            raise LabkitError(f"sweep = {recipe.sweep} is a run of {exp}, not of {notebook}",
                              f"pass the LAB ID of a {notebook} run (labkit show lists a run's notebook)")
        if run.info.status != "FINISHED":
            raise LabkitError(f"sweep = {recipe.sweep} is {run.info.status}, not FINISHED",
                              f"finish it (labkit reproduce --resume {lid.cite}) or name another run")
        return run, run.data.tags.get("lab.id")
    runs = latest_runs(c, notebook, sweep_hash=recipe.sweep_hash) or latest_runs(c, notebook, recipe_name=recipe.name)
    if not runs:
        elsewhere = sorted({run_host(r) for r in latest_runs(c, notebook, recipe_name=recipe.name, host=None)} - {None})
        if elsewhere:
            raise LabkitError(
                f"no finished {notebook} run for recipe {recipe.name} on this host "
                f"({fingerprint.host_label()[0]}); there are runs from {', '.join(elsewhere)}",
                f"run it here (labkit reproduce --recipe {recipe.name} --only {notebook}), or pass "
                "-p sweep=LAB:<id> to read another host's run on purpose",
            )
        changed = [f"-p {k}={json.dumps(getattr(recipe, k))}" for k in recipe.SWEEP_FIELDS
                   if k in getattr(recipe, "origins", {})]
        raise LabkitError(
            f"no finished {notebook} run for recipe {recipe.name} (sweep fields hash {recipe.sweep_hash}) "
            f"in {tracking.redact(tracking.tracking_uri())}",
            f"run it first with the same sweep settings: labkit reproduce --recipe {recipe.name} --only {notebook}"
            + (" " + " ".join(changed) if changed else "")
            + ", or pass -p sweep=LAB:<id> naming a finished sweep",
        )
    return runs[0], runs[0].data.tags.get("lab.id")












