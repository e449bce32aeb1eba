"""Tables built from logged runs only: the results matrix, the accounting worksheet, advice.

Nothing here measures. Every number comes from a finished MLflow run, cited by its
``[LAB: …]`` ID; a field with no run behind it says so instead of holding a value.
"""

from __future__ import annotations

import json

import pandas as pd

from labkit.errors import LabkitError
from labkit.provenance import frames, tracking
from labkit.provenance.ids import parse_id

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
        changed = [f"-p {k}={json.dumps(getattr(recipe, k))}" for k in recipe.SWEEP_FIELDS
                   if k in getattr(recipe, "origins", {})]
        raise LabkitError(
            f"no finished {notebook} run for recipe {recipe.name} (sweep fields hash {recipe.sweep_hash}) "
            f"in {tracking.tracking_uri()}",
            f"run it first with the same sweep settings: labkit reproduce --recipe {recipe.name} --only {notebook}"
            + (" " + " ".join(changed) if changed else "")
            + ", or pass -p sweep=LAB:<id> naming a finished sweep",
        )
    return runs[0], runs[0].data.tags.get("lab.id")












