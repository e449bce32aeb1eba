"""Interrupted measurements keep their arms and resume where they stopped.

The measurement layer on the real engine (k sweep, power runs, tool-suite blocks: an arm
skipped is not measured again, the order stays), then the whole chain on a small
``02_k_sweep`` reproduction run as ``python -m labkit.cli reproduce`` in a subprocess:
interrupted by SIGINT, by SIGTERM and by killing its kernel after some arms (decided by
polling its journal, with bounded waits), its arms found in the store, resumed, and the
resumed run's arms compared with an uninterrupted run's.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import pandas as pd
import pytest

import labkit
import procs
import tiny
from labkit.config.recipe import effective_recipe
from labkit.decoding.drafters.ngram import NgramDrafter
from labkit.errors import LabkitError
from labkit.measure import energy, sweep
from labkit.provenance import arms as arm_journal
from labkit.provenance import resume, tracking
from labkit.suites import qc, toolsuite
from labkit.suites.workloads import load_workload

# protocol full: every k measured, so the arm set does not depend on timings (stepwise stops
# at the first losing step)
# the full grid without the A/A arm: the resume mechanics, not the verdicts, are under test here
# (the A/A arm is an arm like any other: same keys, same journal)
# 5 prompts x (the cold plain run + one warm round of 2 arms) = 15 arms. The chain signals a run
# after 2 arms of its own: the rest (11 in B) are the margin for the signal's way to the kernel
# (with 3 prompts a CI box once finished B's 5 remaining arms before the signal landed)
TINY = {"k": [0, 2], "workloads": ["edit"], "prompts_per_workload": 5, "runs": 1, "max_tokens": 16,
        "drafters": ["ngram"], "temperatures": [0.0], "protocol": "full", "aa_control": False}
PLANNED = TINY["prompts_per_workload"] * 3
ARM = ["prompt", "temperature", "run", "drafter", "k"]  # what identifies an arm in the sweep-runs table
SRC = Path(labkit.__file__).resolve().parents[1]


@pytest.fixture(scope="module", autouse=True)
def kernel_imports_this_checkout():
    """Kernels run in notebooks/: a relative PYTHONPATH would not reach this checkout's src."""
    mp = pytest.MonkeyPatch()
    mp.setenv("PYTHONPATH", os.pathsep.join([str(SRC), *filter(None, [os.environ.get("PYTHONPATH")])]))
    yield
    mp.undo()


class Collect:
    """An on_arm that keeps what it is told (and the planned keys)."""

    def __init__(self):
        self.planned, self.keys, self.rows = [], [], {}

    def plan(self, keys):
        self.planned += keys

    def __call__(self, key, row, records):
        assert records, key
        self.keys.append(key)
        self.rows[key] = {**row, "_records": records}
        return {"origin": "here"}


def test_the_terminal_watcher_gives_an_eta_only_while_planned_arms_remain(tmp_path):
    """What `labkit reproduce` prints from a notebook's journal: done/planned with the ETA
    while arms remain, and no "ETA 0m00s" once the planned ones are done (a search then plans
    its next round: the count goes on)."""
    journal = tmp_path / "arms.jsonl"
    said: list[str] = []
    entries = [("a", 1, 2, 36.0), ("b", 2, 2, 0.0), ("c", 3, 5, 50.0)]
    with arm_journal.JournalWatcher(journal, said.append, label="02| ", every_s=0.0, poll_s=0.02):
        for key, done, planned, eta in entries:
            with open(journal, "a") as f:
                f.write(json.dumps({"type": "arm", "kind": "sweep", "key": key, "done": done, "planned": planned,
                                    "eta_s": eta}) + "\n")
            deadline = time.monotonic() + 10
            while len(said) < done and time.monotonic() < deadline:
                time.sleep(0.02)
    assert said == ["02| arms sweep: 1/2 · ETA 0m36s", "02| arms sweep: 2/2", "02| arms sweep: 3/5 · ETA 0m50s"]


# -- the measurement layer ------------------------------------------------------------------
@pytest.mark.slow
def test_k_sweep_skips_journaled_arms_and_keeps_the_order(engine):
    prompts = load_workload("edit", limit=2)
    kw = {"drafters": {"ngram": NgramDrafter()}, "ks": [0, 2], "runs": 1, "max_tokens": 12}
    full = Collect()
    rows = sweep.k_sweep(engine, prompts, on_arm=full, **kw)
    # per prompt: the cold run (plain, once), then the warm round's two arms
    assert full.keys == full.planned and len(full.keys) == len(set(full.keys)) == len(rows) == 6
    assert (rows["origin"] == "here").all()
    # resume after the first 3 arms: only the other 3 are measured, in the same order
    done = {k: full.rows[k] for k in full.keys[:3]}
    rest = Collect()
    resumed = sweep.k_sweep(engine, prompts, on_arm=rest, skip=done, **kw)
    assert rest.planned == full.planned and rest.keys == full.keys[3:]
    pd.testing.assert_frame_equal(resumed[ARM], rows[ARM])
    assert resumed["tokens"].tolist() == rows["tokens"].tolist()  # greedy: the same generations
    assert resumed["lossless"].all()  # checked across restored and new arms alike


@pytest.mark.slow
def test_power_runs_resume(engine):
    prompts = load_workload("edit", limit=1)
    full = Collect()
    rows = energy.power_runs(engine, prompts, drafter=NgramDrafter(), k=2, runs=1, max_tokens=12, on_arm=full)
    assert full.keys == full.planned and len(full.keys) == 3  # the warm-up (plain), then plain and k=2
    rest = Collect()
    again = energy.power_runs(engine, prompts, drafter=NgramDrafter(), k=2, runs=1, max_tokens=12, on_arm=rest,
                              skip={k: full.rows[k] for k in full.keys[:2]})
    assert rest.keys == full.keys[2:]
    assert again[["prompt", "run", "k"]].values.tolist() == rows[["prompt", "run", "k"]].values.tolist()


@pytest.mark.slow
def test_tool_suite_tasks_resume(engine):
    tasks = toolsuite.load_tasks()[:2]
    kw = {"drafters": {"ngram": NgramDrafter()}, "k": 2, "runs": 1, "temperature": 0.7}
    full = Collect()
    res = qc.control(engine, tasks, on_arm=full, **kw)
    # one arm per task, holding its four runs (greedy off and on, sampled off and on)
    assert full.keys == full.planned and len(full.keys) == 2
    assert [len(full.rows[k]["_rows"]) for k in full.keys] == [4, 4]
    # the journal's JSON form of the first task (its greedy records feed the divergence
    # check), then resumed: only the second task is measured
    skip = {k: json.loads(arm_journal.dumps({**full.rows[k], "_records": arm_journal.compact(full.rows[k]["_records"])}))
            for k in full.keys[:1]}
    rest = Collect()
    again = qc.control(engine, tasks, on_arm=rest, skip=skip, **kw)
    assert rest.keys == full.keys[1:]
    cols = ["spec", "drafter", "temperature", "run", "score"]
    pd.testing.assert_frame_equal(again["scores"][cols], res["scores"][cols])
    assert again["divergences"].equals(res["divergences"])
    assert again["task_pairs"]["output_on"].tolist() == res["task_pairs"]["output_on"].tolist()


def test_drift_table_flags_a_moved_box():
    # SYNTHETIC rows: plain (k=0) tok/s before and after one resume seam
    def rows(origin, values, cold_first=False):
        return [{"k": 0, "cold": cold_first and i == 0, "decode_tok_s": v, "origin": origin, "origin_host": "h",
                 "origin_time": f"t{i}"} for i, v in enumerate(values)]

    quiet = rows("A", [40.0, 41.0, 39.0]) + [{"k": 2, "decode_tok_s": 60.0, "origin": "A"}] + rows("B", [40.5, 39.5])
    (seam,) = arm_journal.drift_table(quiet)
    assert not seam["moved"] and seam["n_before"] == 3 and seam["n_after"] == 2 and seam["before"] == "A"
    busy = rows("A", [40.0, 41.0, 39.0]) + rows("B", [28.0, 30.0, 29.0])
    (seam,) = arm_journal.drift_table(busy)
    assert seam["moved"] and seam["ratio"] == pytest.approx(29.0 / 40.0)
    # cold arms do not count; one origin has no seam
    assert arm_journal.drift_table(rows("A", [10.0, 40.0], cold_first=True)) == []


def test_a_run_that_inherited_every_arm_still_checks_its_seams():
    """A resumed run whose arms all came from earlier runs (the sweep had finished before the
    last interruption) measures nothing, yet its table joins two runs' arms: the seam is checked."""
    # SYNTHETIC journal entries of two earlier runs
    def entries(origin, keys, tok_s):
        return {k: {"row": {"k": 0, "cold": False, "decode_tok_s": tok_s, "origin": origin}} for k in keys}

    book = arm_journal.ArmBook(client=None, run_id="r", run_key="C", journal=lambda e: None,
                               mlflow=lambda fn: None, say=lambda m: None)
    book.plan("sweep", ["a1", "a2", "b1", "b2"])
    book.inherit("sweep", {**entries("A", ["a1", "a2"], 40.0), **entries("B", ["b1", "b2"], 20.0)}, source="B")
    assert book.kind("sweep").measured == 0
    assert book.drift_due() == ["sweep"] and book.drift_due() == []  # once
    (seam,) = arm_journal.drift_table(book.rows_in_order("sweep"))
    assert seam["before"] == "A" and seam["after"] == "B" and seam["moved"]
    # one origin: no seam to check
    one = arm_journal.ArmBook(client=None, run_id="r", run_key="C", journal=lambda e: None,
                              mlflow=lambda fn: None, say=lambda m: None)
    one.plan("sweep", ["a1", "a2"])
    one.inherit("sweep", entries("A", ["a1", "a2"], 40.0), source="A")
    assert one.drift_due() == []


def test_differences_name_what_changed():
    # SYNTHETIC tags of an earlier run
    r = effective_recipe({"recipe": "default", **TINY})
    then = resume.identity(r, commit="a" * 40, engine_tags={"model.sha256": "1" * 64, "engine.flags": "-DX=ON"})
    assert resume.differences(then, then) == []
    now = resume.identity(effective_recipe({"recipe": "default", **TINY, "max_tokens": 8}), commit="b" * 40,
                          engine_tags={"model.sha256": "2" * 64, "engine.flags": "-DX=OFF"})
    diffs = resume.differences(then, now)
    assert [d.split(":")[0] for d in diffs] == ["recipe field max_tokens", "git.commit", "model.sha256",
                                                "engine.flags"]
    run = SimpleNamespace(data=SimpleNamespace(tags={**then, "lab.id": "LAB:02-abcdef-xyz12"}),
                          info=SimpleNamespace(run_id="r1"))
    with pytest.raises(LabkitError, match=r"cannot resume \[LAB:02-abcdef-xyz12\].*max_tokens: 16 then, 8 now"):
        resume.check(run, now)
    resume.check(run, then)  # nothing differs: no refusal


# -- the whole chain, as a user runs it -------------------------------------------------------
def _env() -> dict:
    return {**os.environ, "PYTHONUNBUFFERED": "1"}


def _cli(*args: str) -> list[str]:
    return [sys.executable, "-m", "labkit.cli", "reproduce", "--json", *args]


def _tiny(extra: dict | None = None) -> list[str]:
    return tiny.as_cli({**TINY, **(extra or {})})


def _journal_arms(path: Path) -> list[dict]:
    if not path.is_file():
        return []
    out = []
    for line in path.read_text().splitlines():
        try:
            e = json.loads(line)
        except json.JSONDecodeError:
            continue
        if e.get("type") == "arm" and not e.get("inherited_from"):
            out.append(e)
    return out


def _interrupt(out: Path, argv: list[str], how: str, after_arms: int) -> dict:
    """Run ``labkit reproduce`` (``argv``) into ``out``; interrupt it (``how``) once its
    journal holds ``after_arms`` sweep arms measured by it; wait until it and its kernel are
    gone. ``at_signal``: the sweep arms it had measured when the signal was sent."""
    journal = out / "02_k_sweep.cells.jsonl"
    proc = subprocess.Popen(_cli("--only", "02_k_sweep", "--out", str(out), *argv), env=_env(),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
    seen: set[int] = set()  # every process ever under the reproduction, killed if left over
    try:
        end = time.monotonic() + 1200  # a loaded 2-core box takes minutes to start a kernel
        while len(_measured(journal)) < after_arms:
            assert proc.poll() is None, (f"the reproduction ended before {after_arms} sweep arms of its own (had the "
                                         f"run it resumes finished the sweep after its signal?): {proc.communicate()}")
            assert time.monotonic() < end, "no arms journaled in time"
            seen.update(procs.descendants(proc.pid))
            time.sleep(0.05)
        seen.update(procs.descendants(proc.pid))
        kernels = procs.kernels(proc.pid)
        assert kernels, "no kernel under the reproduction"
        kernel = kernels[0]
        at_signal = len(_measured(journal))
        if how == "kernel":
            os.kill(kernel, signal.SIGKILL)
        else:
            proc.send_signal(signal.SIGINT if how == "sigint" else signal.SIGTERM)
        stdout, stderr = proc.communicate(timeout=300)
        # a kernel whose reproduction died notices it and exits (ipykernel's parent poller)
        left = procs.wait_gone([kernel], 60)
        assert not left, f"the kernel {kernel} outlived its reproduction ({how})"
        return {"journal": journal, "rc": proc.returncode, "stderr": stderr, "stdout": stdout, "out": out,
                "at_signal": at_signal}
    finally:
        for p in [proc.pid, *seen]:
            if procs.alive(p):
                os.kill(p, signal.SIGKILL)


def _run_of(c, out: Path):
    exp = c.get_experiment_by_name("02_k_sweep")
    runs = c.search_runs([exp.experiment_id], filter_string=f"tags.`lab.output` = '{out}'")
    assert len(runs) == 1
    return runs[0]


def _table(c, run, name: str) -> pd.DataFrame:
    from labkit.provenance import frames

    return frames.frame_from_json(tracking.read_artifact(c, run.info.run_id, f"tables/{name}/data.json"))


def _run_cli(argv: list[str], timeout: int = 1800) -> tuple[subprocess.CompletedProcess, dict | None]:
    p = subprocess.run(_cli(*argv), env=_env(), capture_output=True, text=True, timeout=timeout)
    last = p.stdout.strip().splitlines()[-1] if p.stdout.strip() else ""
    return p, (json.loads(last) if last.startswith("{") else None)


@pytest.fixture(scope="module")
def baseline(store):
    """An uninterrupted reproduction: the arm set every resumed run must equal."""
    from labkit.provenance import reproduce as rp

    s = rp.reproduce(only=["02"], out_dir=str(store / "baseline"), params=dict(TINY), auto_resume=False)
    assert s["ok"], s["results"][0]["error"]
    c = tracking.client()
    run = c.get_run(s["results"][0]["run_id"])
    t = run.data.tags
    assert t["arms.done"] == t["arms.planned"] and t["arms.sweep.done"] == t["arms.sweep.planned"] == str(PLANNED)
    return _table(c, run, "sweep-runs")


@pytest.fixture(scope="module")
def chain(store, baseline):
    """One sweep interrupted three ways, each resumption continuing the last:
    A (fresh, SIGINT) -> B (--resume A, SIGTERM) -> X (--resume B with another model file:
    refused) -> C (resumed by default, kernel killed) -> D (resumed by default, finishes)."""
    c = tracking.client()
    out = {}
    out["A"] = _interrupt(store / "A", ["--no-resume", *_tiny()], "sigint", after_arms=2)
    a = _run_of(c, store / "A")
    out["B"] = _interrupt(store / "B", ["--resume", a.data.tags["lab.id"]], "sigterm", after_arms=2)
    b = _run_of(c, store / "B")
    sha = b.data.tags["model.sha256"]
    c.set_tag(b.info.run_id, "model.sha256", "f" * 64)  # as if measured on another file of that name
    try:
        out["X"] = _run_cli(["--resume", b.data.tags["lab.id"], "--out", str(store / "X")])
    finally:
        c.set_tag(b.info.run_id, "model.sha256", sha)
    out["C"] = _interrupt(store / "C", _tiny(), "kernel", after_arms=2)
    out["D"] = _run_cli(["--only", "02_k_sweep", "--out", str(store / "D"), *_tiny()])
    out["runs"] = {name: _run_of(c, store / name) for name in "ABXCD"}
    return out


def _measured(journal: Path) -> set[str]:
    return {e["key"] for e in _journal_arms(journal) if e["kind"] == "sweep"}


def _check_kept(c, run, step: dict, inherited: set[str]) -> None:
    """Every arm the run journaled (and inherited) is in the store; the sweep was cut short
    there: at most the arm running when the signal was sent, and one more finished after it."""
    assert resume.interrupted(run), run.info.status
    kept = arm_journal.read_arms(c, run, "sweep")
    measured = _measured(step["journal"])
    assert measured and set(kept) == measured | inherited, "every completed arm is found again"
    assert len(measured) <= step["at_signal"] + 2, (
        f"the kernel went on measuring after the signal: {step['at_signal']} arms then, {len(measured)} in all; "
        + step["stderr"][-2000:])
    in_store = {a.path.rsplit("/", 1)[-1][: -len(".json")] for a in c.list_artifacts(run.info.run_id, "arms/sweep")}
    # an arm goes to the local journal first: only one being written at the kill may be missing from MLflow
    assert in_store <= set(kept) and len(set(kept) - in_store) <= 1
    assert 0 < len(kept) < int(run.data.tags["arms.sweep.planned"]) == PLANNED, (
        f"interrupted in the sweep: {len(inherited)} inherited, {step['at_signal']} measured at the signal, "
        f"{len(kept)} of {PLANNED} kept")


@pytest.mark.slow  # papermill sweep, interrupted
def test_sigint_keeps_every_completed_arm(chain):
    from labkit.provenance.show import show

    c, a = tracking.client(), chain["runs"]["A"]
    assert a.info.status in ("KILLED", "FAILED"), chain["A"]["stderr"][-2000:]
    assert chain["A"]["rc"] in (130, 1)
    measured = _measured(chain["A"]["journal"])
    _check_kept(c, a, chain["A"], set())
    shown = show(a.data.tags["lab.id"])
    assert shown["arms"]["sweep.planned"] == str(PLANNED) and int(shown["arms"]["sweep.done"]) >= len(measured) - 1


@pytest.mark.slow  # papermill sweep, interrupted
def test_sigterm_keeps_every_completed_arm(chain):
    # KILLED where SIGTERM is handled; FAILED when the kernel was shut down under it;
    # RUNNING (with its processes gone) when the process died outright
    c, b = tracking.client(), chain["runs"]["B"]
    assert b.info.status in ("KILLED", "FAILED", "RUNNING"), chain["B"]["stderr"][-2000:]
    assert b.data.tags["resume.from"] == chain["runs"]["A"].data.tags["lab.id"]
    _check_kept(c, b, chain["B"], set(arm_journal.read_arms(c, chain["runs"]["A"], "sweep")))


@pytest.mark.slow  # papermill sweep, interrupted
def test_a_killed_kernel_keeps_every_completed_arm(chain):
    c, r = tracking.client(), chain["runs"]["C"]
    assert r.info.status == "FAILED" and chain["C"]["rc"] == 1
    # resumed by default: the newest interrupted run with arms (B), not the refused X, which kept none
    assert r.data.tags["resume.from"] == chain["runs"]["B"].data.tags["lab.id"]
    _check_kept(c, r, chain["C"], set(arm_journal.read_arms(c, chain["runs"]["B"], "sweep")))


@pytest.mark.slow  # papermill sweep, interrupted
def test_resume_refuses_another_model_file(chain):
    """The model's sha256 is checked once the notebook has opened its engine; nothing is inherited."""
    p, summary = chain["X"]
    assert p.returncode == 1 and summary is not None, p.stderr[-2000:]
    res = summary["results"][0]
    assert res["status"] == "FAILED" and "model.sha256: " + "f" * 64 + " then" in res["error"]
    assert not res["arms"].get("inherited") and not chain["runs"]["X"].data.tags.get("arms.done")


@pytest.mark.slow  # papermill sweep, interrupted
def test_resumed_run_equals_an_uninterrupted_one(chain, baseline, store):
    c = tracking.client()
    p, summary = chain["D"]
    assert p.returncode == 0 and summary["ok"], p.stderr[-3000:]
    runs = chain["runs"]
    new = runs["D"]
    tags = new.data.tags
    assert tags["resume.from"] == runs["C"].data.tags["lab.id"] and summary["results"][0]["resumed_from"]
    assert tags["arms.sweep.done"] == tags["arms.sweep.planned"] == str(PLANNED)
    table = _table(c, new, "sweep-runs")
    # the same arm set as an uninterrupted run, each arm once, and the same greedy generations
    assert sorted(map(tuple, table[ARM].values.tolist())) == sorted(map(tuple, baseline[ARM].values.tolist()))
    assert not table.duplicated(ARM).any()
    merged = table.merge(baseline, on=ARM, suffixes=("", "_base"))
    assert (merged["tokens"] == merged["tokens_base"]).all() and (merged["accepted"] == merged["accepted_base"]).all()
    # each arm measured exactly once across the chain, and its origin is the run that measured it
    measured = {name: _measured(store / name / "02_k_sweep.cells.jsonl") for name in "ABCD"}
    assert sum(len(m) for m in measured.values()) == PLANNED and set().union(*measured.values()) == set(
        arm_journal.read_arms(c, new, "sweep"))
    keys = {tuple(r[a] for a in ARM): r for r in table.to_dict("records")}
    for name, ms in measured.items():
        for key in ms:
            e = arm_journal.read_arms(c, new, "sweep")[key]["row"]
            row = keys[tuple(e[a] for a in ARM)]
            assert row["origin"] == runs[name].data.tags["lab.run"] and row["origin_host"] and row["origin_time"]
    # the seam between the last plain arms before an interruption and the first after
    plain = table[(table["k"] == 0) & ~table["cold"]]
    if plain["origin"].nunique() > 1:
        drift = _table(c, new, "arms-drift-sweep")
        assert len(drift) == plain["origin"].nunique() - 1
        assert tags["arms.drift.sweep"].startswith(("within noise", "moved"))


@pytest.mark.slow  # papermill sweep, interrupted
def test_resume_refuses_a_changed_recipe_or_commit(chain):
    c = tracking.client()
    run = chain["runs"]["A"]
    lid = run.data.tags["lab.id"]
    n_runs = len(c.search_runs([run.info.experiment_id]))
    # another sweep field; another model (the F16 target recipe, same tiny sweep otherwise)
    for argv, named in ((_tiny({"max_tokens": 8}), "recipe field max_tokens: 16 then, 8 now"),
                        (["--recipe", "f16-target", *_tiny()], 'recipe field model: "gemma-3-270m-q4_k_m" then')):
        p, _ = _run_cli(["--resume", lid, *argv], timeout=600)
        assert p.returncode == 2 and named in p.stderr and "fix:" in p.stderr, p.stderr[-2000:]
    commit = run.data.tags["git.commit"]
    c.set_tag(run.info.run_id, "git.commit", "0" * 40)  # as if measured at another commit
    try:
        p, _ = _run_cli(["--resume", lid], timeout=600)
        assert p.returncode == 2 and "git.commit: " + "0" * 40 + " then" in p.stderr, p.stderr[-2000:]
    finally:
        c.set_tag(run.info.run_id, "git.commit", commit)
    assert len(c.search_runs([run.info.experiment_id])) == n_runs, "a refused resume records nothing"
