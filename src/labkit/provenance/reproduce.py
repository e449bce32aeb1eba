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
import signal
import threading
import time
from collections.abc import Callable
from pathlib import Path

from labkit.config.recipe import effective_recipe
from labkit.errors import LabkitError
from labkit.paths import project_root
from labkit.provenance import arms as arm_journal
from labkit.provenance import (
    committed,
    fingerprint,
    machine_state,
    run_page,
    runlock,
    runtags,
    tracking,
)
from labkit.provenance import pace as pace_mod
from labkit.provenance import resume as resume_mod
from labkit.provenance.drift import compare_with_previous
from labkit.provenance.execution import Limits, register
from labkit.provenance.sync import apply_close
from labkit.suites.workloads import require_prompts


def notebooks_dir() -> Path:
    """``$LABKIT_NOTEBOOKS`` or the project's notebooks/."""
    env = os.environ.get("LABKIT_NOTEBOOKS")
    return Path(env) if env else project_root() / "notebooks"


def discover(only: list[str] | None = None, recipe=None) -> list[Path]:
    """The notebooks to run: ``NN_name.ipynb`` in order, filtered by --only or the recipe."""
    all_nb = sorted(p for p in notebooks_dir().glob("[0-9][0-9]_*.ipynb"))
    wanted = only or (recipe.notebooks if recipe is not None and recipe.notebooks else None)
    if not wanted:  # the whole suite: a notebook that summarises the others' runs comes after them
        return sorted(all_nb, key=runs_last)
    out = []
    for w in wanted:
        hits = [p for p in all_nb if p.stem == w or p.stem.startswith(w) or p.stem.split("_", 1)[-1] == w]
        if not hits:
            raise LabkitError(f"no notebook matches {w!r}", f"available: {', '.join(p.stem for p in all_nb)}")
        out += [h for h in hits if h not in out]
    return out


def runs_last(nb: Path) -> bool:
    """True for a notebook whose metadata says ``labkit: {runs_last: true}`` (the results
    matrix, which reads every other notebook's newest run, so a full reproduction's
    matrix cites that reproduction's own runs)."""
    try:
        meta = json.loads(nb.read_text()).get("metadata", {})
    except (OSError, ValueError):
        return False
    return bool((meta.get("labkit") or {}).get("runs_last"))


def declared_parameters(nb: Path) -> dict:
    """The notebook's parameters cell, or a clear error when it has none."""
    import papermill as pm

    declared = pm.inspect_notebook(str(nb))
    if not declared:
        raise LabkitError(
            f"{nb.name} has no cell tagged 'parameters'",
            "tag the notebook's first code cell 'parameters' (JupyterLab: property inspector > cell tags)",
        )
    missed = [a for a in _assigned(nb) if a[0] not in declared]
    if missed:  # papermill only logs "Unable to parse line"; the parameter would then be refused as unknown
        name, line = missed[0]
        raise LabkitError(f"papermill cannot parse the parameters cell of {nb.name} at {line!r}, so {name!r} "
                          "would not be a parameter",
                          "keep each parameter on one line as `name = value  # comment`, with no '<', '>' or "
                          "brackets in the comment")
    return declared


def _assigned(nb: Path) -> list[tuple[str, str]]:
    """(name, source line) of each top-level assignment in the notebook's parameters cell."""
    import ast

    import nbformat

    for cell in nbformat.read(nb, as_version=4).cells:
        if "parameters" in cell.metadata.get("tags", []):
            lines = cell.source.splitlines()
            return [(t.id, lines[node.lineno - 1]) for node in ast.parse(cell.source).body
                    if isinstance(node, ast.Assign) for t in node.targets if isinstance(t, ast.Name)]
    return []


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
                 limits: Limits | None = None, extra_tags: dict | None = None,
                 started: Callable | None = None, resume_from=None, parent: str | None = None) -> dict:
    """Execute one notebook as one MLflow run; never raises for a failing notebook
    (``limits``: per-cell and whole-run timeouts; ``started(lab_id)`` once the run exists;
    ``resume_from``: an interrupted MLflow run of this notebook that hands its arms on;
    ``parent``: the reproduction's parent run)."""
    import papermill as pm
    from nbclient.exceptions import CellTimeoutError

    recipe = effective_recipe(params)
    limits = limits or Limits(recipe.cell_timeout_s)
    prov = fingerprint.collect(recipe=recipe)
    journal = out / f"{nb.stem}.cells.jsonl"
    tags = {**runtags.flat_tags(prov), "papermill.parameters": json.dumps(params, default=str),
            "lab.mode": "papermill", "lab.notebook": nb.stem, "lab.output": str(out),
            "recipe.effective_hash": recipe.hash, "recipe.sweep_hash": recipe.sweep_hash,
            # the hash of what reproduce passed, kept: a downstream notebook's session sets
            # effective_hash again with the 02 run it read (08's sweep), so provenance.pace
            # finds the last run like this one by this tag
            "recipe.reproduce_hash": recipe.hash,
            "lab.cell_timeout_s": str(limits.cell_s), "lab.pid": os.getpid(), "lab.journal": str(journal),
            **(extra_tags or {})}
    if resume_from is not None:
        tags.update({"resume.from": resume_from.data.tags.get("lab.id"), "resume.from_run_id": resume_from.info.run_id})
    rid, lab = tracking.new_run(c, notebook=nb.name, recipe=recipe, tags=tags,
                                run_name=f"{nb.stem} · {recipe.name}", parent=parent)
    if started:
        started(str(lab))
    tracking.log_json(c, rid, prov, "fingerprint.json")
    monitor = run_page.start_system_metrics(rid)
    executed = out / nb.name
    env = {"LABKIT_RUN_ID": rid, "LABKIT_LAB_RUN": lab.run, "LABKIT_JOURNAL": str(journal),
           "LABKIT_NOTEBOOK": nb.stem, "MLFLOW_TRACKING_URI": tracking.tracking_uri(),
           "LABKIT_ROOT": str(project_root()),
           "LABKIT_RESUME_FROM": resume_from.info.run_id if resume_from is not None else ""}
    saved = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    status, error = "FINISHED", None
    t0 = time.perf_counter()
    pace = pace_mod.previous(c, rid, nb.stem) if progress else None
    if progress:
        progress(f"{nb.stem}: running as [{lab}]" + (f"; {pace.start_line()}" if pace else ""))
    interrupted = None
    box = machine_state.snapshot() if machine_state.supported() else None
    try:
        with arm_journal.JournalWatcher(journal, progress or (lambda _m: None), label=f"{nb.stem}: "):
            pm.execute_notebook(str(nb), str(executed), parameters=params, progress_bar=False,
                                cwd=str(nb.parent), kernel_name="python3", engine_name=register(),
                                limits=limits, progress=progress, name=nb.stem, pace=pace)
    except pm.PapermillExecutionError as e:
        status, error = "FAILED", f"cell {e.exec_count}: {e.ename}: {e.evalue}"
    except CellTimeoutError as e:  # nbclient has shut the kernel down; what was logged stays
        status, error = "FAILED", _timeout_reason(e, limits)
    except Exception as e:  # kernel death, missing kernel, ...: the run is still closed as FAILED
        status, error = "FAILED", f"{type(e).__name__}: {e}"
    except BaseException as e:  # Ctrl-C / SIGTERM: close the run as KILLED, keep its records, re-raise
        status, error, interrupted = "KILLED", f"interrupted ({type(e).__name__})", e
    finally:
        for k, v in saved.items():
            os.environ.pop(k) if v is None else os.environ.__setitem__(k, v)
    seconds = time.perf_counter() - t0
    close = {"run": lab.run, "type": "close", "status": status, "error": error, "seconds": seconds,
             "files": [str(executed), str(journal)]}
    pending = False
    try:
        if box is not None:
            state = machine_state.between(box, machine_state.snapshot())
            for k, v in machine_state.tags(state).items():
                c.set_tag(rid, k, v)
            if status == "FINISHED" and recipe.max_busy is not None and state["machine.busy"] > recipe.max_busy:
                status, error = "FAILED", (
                    f"the machine was busy during the run: other processes took {state['machine.busy']:.0%} of "
                    f"its CPUs (recipe max_busy = {recipe.max_busy:.0%}; busiest: "
                    f"{state['machine.top_others'] or 'none stood out'}); its timings are not this box's own")
        close.update(status=status, error=error)
        if executed.exists():
            run_page.log_notebook_html(c, rid, executed)
        run_page.stop_system_metrics(monitor)
        run_page.write_note(c, rid, lab_id=str(lab), notebook=nb.stem, recipe=recipe, produced=_produced(journal),
                            status=status + (f": {error}" if error else ""))
        apply_close(c, rid, close)
    except Exception as e:  # the store went away: the journal keeps the close for `labkit sync`
        pending = True
        with open(journal, "a") as f:
            f.write(json.dumps(close, default=str) + "\n")
        if progress:
            progress(f"{nb.stem}: MLflow did not answer while closing the run ({type(e).__name__}); "
                     f"its records are in {journal}: run `labkit sync` when the store is back")
    finally:
        run_page.stop_system_metrics(monitor)
    if interrupted is not None:
        raise interrupted
    produced = _produced(journal)
    if progress:
        progress(f"{nb.stem}: {status} in {seconds:.0f} s" + (f" ({error})" if error else ""))
    try:
        done = c.get_run(rid).data.tags
    except Exception:  # the store is away (the close is pending in the journal)
        done = {}
    arms = {k[len("arms."):]: v for k, v in done.items() if k.startswith("arms.")}
    return {"notebook": nb.stem, "id": str(lab), "run_id": rid, "status": status, "error": error,
            "seconds": round(seconds, 1), "executed": str(executed), "produced": produced,
            "recipe": recipe.name, "recipe_hash": recipe.hash, "arms": arms,
            "resumed_from": done.get("resume.from"), "journal": str(journal),
            **({"sync": "pending"} if pending else {})}


def _timeout_reason(e: Exception, limits: Limits) -> str:
    lines = str(e).split("-------------------")
    first = lines[1].strip().splitlines()[0][:80] if len(lines) > 1 and lines[1].strip() else "?"
    if limits.deadline_passed():
        return f"the whole-run limit (run_timeout_s / --timeout) was reached in the cell starting {first!r}"
    return f"a cell ran past cell_timeout_s = {limits.cell_s:g} s: the cell starting {first!r}"


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


class Terminated(BaseException):
    """SIGTERM (systemd stop, ``timeout``, a CI cancel), raised like KeyboardInterrupt so the
    running notebook is closed the same way: KILLED, its records uploaded, no kernel left."""


def _on_sigterm(signum, frame):
    signal.signal(signal.SIGTERM, signal.SIG_IGN)  # a second TERM must not cut the cleanup short
    raise Terminated()


def reproduce(*, recipe: str | None = None, only: list[str] | None = None, out_dir: str | None = None,
              params: dict | None = None, progress: Callable | None = None, allow_dirty: bool = False,
              timeout: float | None = None, wait: float | None = None, resume: str | None = None,
              auto_resume: bool = True) -> dict:
    """Run the selected notebooks; returns the summary (also written to the output folder).

    ``allow_dirty`` runs notebooks that differ from the commit (recorded); ``timeout`` is
    the whole-run limit in seconds (else the recipe's ``run_timeout_s``); ``wait`` seconds
    to queue behind another reproduction of this checkout or store (else refuse).
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
    require_prompts(eff.workloads, eff.prompts_per_workload, missing_ok=True, reserve=eff.reserve_prompts)
    nbs = discover(only, eff)
    routed = route_parameters(nbs, base)  # refuse bad input before anything runs or is recorded
    git_tags = committed.check(nbs, allow_dirty=allow_dirty)
    run_limit = timeout if timeout is not None else eff.run_timeout_s
    deadline = time.monotonic() + run_limit if run_limit else None
    out = Path(out_dir) if out_dir else None
    info = {"recipe": eff.name, "output": str(out) if out else "(not yet chosen)"}
    main_thread = threading.current_thread() is threading.main_thread()
    previous = signal.signal(signal.SIGTERM, _on_sigterm) if main_thread else None
    # SIGINT interrupts even a reproduction started in the background (`nohup`, `cmd &` in a
    # script), which inherits SIGINT ignored: `kill -INT` then keeps the arms like Ctrl-C does
    previous_int = signal.signal(signal.SIGINT, signal.default_int_handler) if main_thread else None
    results: list[dict] = []
    parent = parent_pending = None
    try:
        with runlock.hold(runlock.lock_paths(tracking.tracking_uri()), info, wait=wait, progress=progress) as lock:
            c = tracking.client()  # inside the lock: a new store's schema is created once, not twice at once
            machine_state.refuse_if_busy(eff.max_busy)
            sources = _resume_sources(c, nbs, routed, source, auto_resume, progress)
            if out is None:
                out = runlock.output_folder(eff.name)
            out.mkdir(parents=True, exist_ok=True)
            lock.update(output=str(out))
            parent = tracking.new_parent_run(c, recipe=eff, notebooks=[nb.stem for nb in nbs], output=str(out),
                                             tags=runtags.flat_tags(fingerprint.collect(recipe=eff)))
            before = pace_mod.previous_reproduction(c, parent) if progress and len(nbs) > 1 else None
            if before:
                progress(f"{len(nbs)} notebooks; last time here they took {arm_journal.fmt_s(before[0])} in all ({before[1]})")
            for nb in nbs:
                limits = Limits(effective_recipe(routed[nb]).cell_timeout_s, deadline)
                if limits.deadline_passed():
                    results.append({"notebook": nb.stem, "id": None, "run_id": None, "status": "SKIPPED",
                                    "error": "the whole-run limit was reached before it started", "produced": []})
                    continue
                res = run_notebook(c, nb, routed[nb], out, progress=progress, limits=limits,
                                   extra_tags=git_tags[nb], started=lambda lab_id: lock.update(lab_id=lab_id),
                                   resume_from=sources.get(nb.stem), parent=parent)
                if res["status"] == "FINISHED" and "sync" not in res:
                    res["comparison"] = compare_with_previous(c, res)
                    if nb.stem == SWEEP_NOTEBOOK:  # later notebooks read exactly this sweep
                        for later in nbs[nbs.index(nb) + 1:]:
                            if "sweep" in declared_parameters(later) and "sweep" not in base:
                                routed[later]["sweep"] = res["id"]
                results.append(res)
                (out / "summary.json").write_text(json.dumps({"results": results}, indent=1, default=str))
            parent_pending = _close_parent(c, parent, tracking.parent_close(parent, results), out, progress)
    except (KeyboardInterrupt, Terminated) as e:
        if parent is not None:
            _close_parent(c, parent, tracking.parent_close(parent, results, status="KILLED",
                                                           tags={"lab.interrupted": type(e).__name__}), out, progress)
        if out is not None and out.is_dir():
            (out / "summary.json").write_text(json.dumps(
                {"ok": False, "interrupted": type(e).__name__, "output": str(out), "results": results},
                indent=1, default=str))
        e.summary = {"ok": False, "interrupted": type(e).__name__, "output": str(out) if out else None,
                     "results": results}
        raise
    finally:
        for sig, handler in ((signal.SIGTERM, previous), (signal.SIGINT, previous_int)):
            if main_thread and handler is not None:  # None: a handler not set from Python; leave ours
                signal.signal(sig, handler)
    pending = [r["journal"] for r in results if "sync" in r]  # finished, but not all in the store yet
    pending += [parent_pending] if parent_pending else []
    ok = all(r["status"] == "FINISHED" for r in results) and not pending
    moved = sum(len((r.get("comparison") or {}).get("moved", [])) for r in results)
    summary = {"ok": ok, "pending_sync": pending, "output": str(out), "tracking_uri": tracking.redact(tracking.tracking_uri()),
               "recipe": eff.name, "recipe_hash": eff.hash, "moved": moved, "results": results}
    (out / "summary.json").write_text(json.dumps(summary, indent=1, default=str))
    return summary


def _close_parent(c, parent: str, rec: dict, out: Path | None, progress) -> str | None:
    """Close the parent run; when the store does not answer, journal the close beside the
    notebooks' journals (``labkit sync`` applies it) and return that journal's path."""
    try:
        tracking.finish_parent(c, parent, rec)
        return None
    except Exception as e:  # the store went away: never lose the reproduction's summary over it
        if out is None:
            raise
        journal = out / "reproduce.parent.jsonl"
        with open(journal, "a") as f:
            f.write(json.dumps(rec, default=str) + "\n")
        if progress:
            progress(f"MLflow did not answer while closing the parent run ({type(e).__name__}); its close is in "
                     f"{journal}: run `labkit sync` when the store is back")
        return str(journal)


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
