"""Resuming an interrupted notebook run: which run, and whether it may be resumed.

A run is *interrupted* when MLflow marks it KILLED or FAILED, or RUNNING while the
processes that wrote it (``lab.pid``, ``lab.kernel_pid``, on ``host.name``) are gone
(a reproduction killed by SIGKILL, or a reboot, never closes its run).

Resuming continues a run only where nothing that decides the measurements changed:
the recipe's sweep fields (``Recipe.SWEEP_FIELDS``), the git commit, the model's
sha256 and the engine build. The recipe and commit are checked before anything runs
(``labkit reproduce``); the model and engine once the notebook has opened its engine
(``Lab.arms``). Every difference is named.

``labkit reproduce`` resumes by default when the newest run of the same notebook,
effective recipe and commit was interrupted and kept arms; ``--no-resume`` starts afresh.
"""

from __future__ import annotations

import json
import os
import platform

from labkit.errors import LabkitError
from labkit.provenance import ids, tracking

INTERRUPTED = ("KILLED", "FAILED")
# run tags that must agree between the interrupted run and its resumption
ENGINE_TAGS = ("model.sha256", "engine", "engine.version", "engine.commit", "engine.flags")


def sweep_fields(recipe) -> dict:
    d = recipe.to_dict()
    return {k: d[k] for k in recipe.SWEEP_FIELDS}


def identity(recipe, *, commit: str | None, engine_tags: dict | None = None) -> dict:
    """What a resumed run must share with the run it continues, as run-tag values."""
    out = {"recipe.sweep": json.dumps(sweep_fields(recipe), sort_keys=True), "recipe.sweep_hash": recipe.sweep_hash}
    if commit:
        out["git.commit"] = commit
    for t in ENGINE_TAGS:
        if engine_tags and engine_tags.get(t) is not None:
            out[t] = str(engine_tags[t])
    return out


def differences(prev_tags: dict, now: dict) -> list[str]:
    """Human-readable differences between an earlier run's tags and ``identity(...)``;
    a field is compared only when both sides recorded it."""
    diffs = []
    if "recipe.sweep" in prev_tags and "recipe.sweep" in now:
        a, b = json.loads(prev_tags["recipe.sweep"]), json.loads(now["recipe.sweep"])
        for f in sorted(set(a) | set(b)):
            if a.get(f) != b.get(f):
                diffs.append(f"recipe field {f}: {json.dumps(a.get(f))} then, {json.dumps(b.get(f))} now")
    elif prev_tags.get("recipe.sweep_hash") and prev_tags["recipe.sweep_hash"] != now.get("recipe.sweep_hash"):
        diffs.append(f"recipe sweep fields (hash {prev_tags['recipe.sweep_hash']} then, "
                     f"{now.get('recipe.sweep_hash')} now)")
    for t in ("git.commit", *ENGINE_TAGS):
        if t in prev_tags and t in now and str(prev_tags[t]) != str(now[t]):
            diffs.append(f"{t}: {prev_tags[t]} then, {now[t]} now")
    return diffs


def check(run, now: dict) -> None:
    """Refuse to resume ``run`` when anything in ``now`` (see ``identity``) differs."""
    diffs = differences(run.data.tags, now)
    if diffs:
        lid = run.data.tags.get("lab.id", run.info.run_id)
        raise LabkitError(
            f"cannot resume [{lid}]: what its arms were measured with differs: " + "; ".join(diffs),
            "resume with the same recipe fields, model, engine build and commit "
            f"(git checkout {run.data.tags.get('git.commit', '<its commit>')[:12]}), "
            "or start afresh with --no-resume",
        )


def _alive(pid: str | None) -> bool:
    if not pid or not pid.isdigit():
        return False
    try:
        os.kill(int(pid), 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def interrupted(run) -> bool | None:
    """True when the run was interrupted, False when it finished or is alive, None when
    it is RUNNING on another host (whether its process lives cannot be told from here)."""
    status = run.info.status
    if status in INTERRUPTED:
        return True
    if status != "RUNNING":
        return False
    tags = run.data.tags
    if tags.get("host.name") != platform.node():
        return None
    return not any(_alive(tags.get(t)) for t in ("lab.pid", "lab.kernel_pid"))


def arms_done(run) -> int:
    try:
        return int(run.data.tags.get("arms.done", "0"))
    except ValueError:
        return 0


def source_for(c, run_key: str):
    """The run an explicit ``--resume LAB:…`` names, checked to be interrupted."""
    lid = ids.parse_id(run_key)
    run = tracking.find_run(c, lid.run)
    state = interrupted(run)
    if state is None:
        raise LabkitError(
            f"[{lid.cite}] is RUNNING on host {run.data.tags.get('host.name')}; labkit cannot tell from here "
            "whether it still runs",
            "stop it there first; if that host is gone, mark the run KILLED (MLflow UI, or "
            f"MlflowClient().set_terminated('{run.info.run_id}', 'KILLED')) and resume again",
        )
    if not state:
        what = "still running (its process is alive)" if run.info.status == "RUNNING" else run.info.status
        raise LabkitError(f"[{lid.cite}] is {what}: there is nothing to resume",
                          "resume a KILLED or FAILED run, or run without --resume")
    return run


def newest_interrupted(c, notebook: str, *, recipe_hash: str, commit: str | None):
    """For resume-by-default: the newest run of ``notebook`` with this effective recipe and
    commit, when it was interrupted; if it kept no arms, the newest earlier interrupted one
    that did (a resume that failed before measuring hands nothing on). None after a
    finished run, or when none kept arms."""
    exp = tracking.get_experiment(c, notebook)  # under the configured prefix
    if exp is None or not commit:
        return None
    runs = c.search_runs([exp.experiment_id],
                         filter_string=f"tags.`recipe.effective_hash` = '{recipe_hash}' and "
                                       f"tags.`git.commit` = '{commit}'",
                         order_by=["attributes.start_time DESC"], max_results=20)
    for run in runs:
        state = interrupted(run)
        if not state:  # finished, alive, or unknowable: nothing to resume by default
            return None
        if arms_done(run) > 0:
            return run
    return None
