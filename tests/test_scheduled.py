"""Scheduled reproductions: limits, signals, one at a time, a busy box, drift that pages,
the committed notebooks, and the shipped systemd unit and crontab run as written.

Real papermill, real Jupyter kernels, a real MLflow store. Most notebooks here are
SYNTHETIC (written by the test: a metric, a print, a sleep) so that a timeout or a signal
lands at a known cell in seconds; the deploy test runs the real 01_cost_fit with tiny
parameters. Every process a test starts is stopped in ``finally``.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import nbformat
import pytest

import procs
import tiny
from labkit.errors import LabkitError
from labkit.paths import cache_dir
from labkit.provenance import machine_state, runlock, tracking
from labkit.provenance import reproduce as rp

ROOT = Path(__file__).resolve().parents[1]
FAST = tiny.FAST_01
SWEEP_FAST = {"runs": 1, "max_runs": 1, "prompts_per_workload": 1, "workloads": ["edit"], "k": [0, 1], "max_tokens": 8,
              "drafters": ["ngram"], "temperatures": [0.0], "protocol": "stepwise"}
SRC = str(ROOT / "src")


# -- helpers -------------------------------------------------------------------------------
def _write_nb(path: Path, cells: list[str]) -> Path:
    """A SYNTHETIC notebook: the first cell is the parameters cell."""
    nb = nbformat.v4.new_notebook()
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    for i, src in enumerate(cells):
        cell = nbformat.v4.new_code_cell(src)
        cell.metadata["tags"] = ["parameters"] if i == 0 else []
        nb.cells.append(cell)
    nbformat.write(nb, path)
    return path


START = "from labkit import lab as L\nlab = L.start(globals())"


def _env(**extra) -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("LABKIT_", "MLFLOW_", "AS_SPEC_"))}
    env["PYTHONPATH"] = SRC + os.pathsep + env.get("PYTHONPATH", "")
    for k in ("LABKIT_CACHE", "MLFLOW_TRACKING_URI"):
        if k in os.environ:
            env[k] = os.environ[k]
    # the machine's cache (models, the one llama.cpp build) even where a test moves HOME, as an
    # operator's HOME holds what their `make setup` built: not a second 14-minute build per test
    env.setdefault("LABKIT_CACHE", str(cache_dir()))
    env.update(extra)
    return env


def _cli(*args, env: dict, cwd=None, preexec_fn=None) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "labkit.cli", "reproduce", "--json", *args], env=env, cwd=cwd,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, preexec_fn=preexec_fn)


def _record(text: str) -> dict:
    """The summary.json the last human summary line in ``text`` names."""
    paths = re.findall(r"the whole record: (\S+/summary\.json)$", text, re.M)
    assert paths, text[-3000:]
    return json.loads(Path(paths[-1]).read_text())


def _runs(c) -> list:
    exps = [e.experiment_id for e in c.search_experiments()]
    return c.search_runs(exps) if exps else []


SPIN = ("import os, sys, time\n"
        "open(sys.argv[1], 'a').write(f'{os.getpid()}\\n')\n"
        "end = time.monotonic() + float(sys.argv[2]); cpu = float(sys.argv[3])\n"
        "while time.monotonic() < end and time.process_time() < cpu:\n    pass\n")


def _spin_elsewhere(tmp_path: Path, n: int, *, wall: float, cpu: float) -> list[int]:
    """Start ``n`` busy loops that are NOT our descendants (started through a shell that
    exits at once, so they are reparented): to our process tree they are another job."""
    pids = tmp_path / f"spin-{time.monotonic_ns()}.pids"
    cmd = " ".join(f"{shlex.quote(sys.executable)} -c {shlex.quote(SPIN)} {pids} {wall} {cpu} "
                   f">/dev/null 2>&1 &" for _ in range(n))
    subprocess.run(["sh", "-c", cmd], check=True, timeout=30)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        got = pids.read_text().split() if pids.exists() else []
        if len(got) == n:
            return [int(p) for p in got]
        time.sleep(0.05)
    raise AssertionError("the busy loops did not start")


def _stop(pids: list[int]) -> None:
    for p in pids:
        try:
            os.kill(p, signal.SIGKILL)
        except ProcessLookupError:
            pass


@pytest.fixture
def nb_dir(tmp_path, monkeypatch):
    """A SYNTHETIC notebook folder, and a throwaway checkout root for runs/ and the lock."""
    d = tmp_path / "notebooks"
    d.mkdir()
    monkeypatch.setenv("LABKIT_NOTEBOOKS", str(d))
    monkeypatch.setenv("LABKIT_ROOT", str(tmp_path / "root"))
    (tmp_path / "root" / "experiments").mkdir(parents=True)
    shutil.copy(ROOT / "experiments" / "default.yaml", tmp_path / "root" / "experiments")
    return d


# -- timeouts --------------------------------------------------------------------------------
@pytest.mark.slow  # papermill
def test_cell_timeout_fails_the_run_keeps_its_records_and_stops_the_kernel(store, nb_dir, tmp_path):
    _write_nb(nb_dir / "81_hangs.ipynb", [
        'recipe = "default"', START, "import time\nlab.metric('before_hang', 1.0)",
        "time.sleep(150)  # a hung decode", "lab.metric('never', 1.0)"])
    # the start cell's imports take ~3 s on a 2-core box (~6 s on the slowest we have seen): 12 s
    # leaves twice that and keeps the wait short
    recipe = tiny.recipe_file(tmp_path / "tiny.yaml", cell_timeout_s=12)
    t0 = time.monotonic()
    said: list[str] = []
    summary = rp.reproduce(recipe=recipe, only=["81"], out_dir=str(tmp_path / "out"), progress=said.append)
    assert time.monotonic() - t0 < 300
    assert any(m.startswith("81_hangs: cell 5/6 failed (") for m in said), said  # papermill adds the parameters cell; not "done"
    r = summary["results"][0]
    assert not summary["ok"] and r["status"] == "FAILED"
    assert "cell_timeout_s = 12 s" in r["error"] and "time.sleep(150)" in r["error"]
    run = tracking.client().get_run(r["run_id"])
    assert run.info.status == "FAILED" and run.data.tags["lab.error"] == r["error"]
    assert run.data.metrics["before_hang"] == 1.0 and "never" not in run.data.metrics
    logged = {a.path for a in tracking.client().list_artifacts(r["run_id"], "notebook")}
    assert {"notebook/81_hangs.ipynb", "notebook/81_hangs.cells.jsonl"} <= logged
    assert procs.kernels(os.getpid()) == []


def test_pace_reads_the_cell_times_papermill_recorded():
    from labkit.provenance import pace

    # SYNTHETIC executed notebook: a markdown cell, four code cells (one never ran)
    nb = {"cells": [{"cell_type": "markdown", "metadata": {}},
                    *({"cell_type": "code", "metadata": {"papermill": {"duration": d}}} for d in (0.5, 90.0, 3.0)),
                    {"cell_type": "code", "metadata": {}}]}
    p = pace.Pace("LAB:02-abcdef-xyz12", pace.cell_durations(nb))
    assert p.cells == (0.5, 90.0, 3.0, None) and p.total == 93.5 and p.fits(4) and not p.fits(5)
    assert p.left_after(0) == 93.0 and p.done_suffix(0) == " · about 1m33s left" and p.done_suffix(2) == ""
    assert p.start_line_of(1, 4) == "cell 2/4 running; it took 1m30s in [LAB:02-abcdef-xyz12]"
    assert p.start_line_of(2, 4) is None and p.start_line_of(3, 4) is None  # short; not recorded
    assert p.start_line() == "last time here its cells took 1m34s [LAB:02-abcdef-xyz12]"


def test_pace_comes_from_this_machine_and_never_from_a_resumed_run(store):
    """Runs in a real store (their notebooks SYNTHETIC executed notebooks): the newest
    finished run is a resumed one (its sweep cell measured only the missing arms) and the
    next is another machine's; the pace is the one after them."""
    from labkit.provenance import pace

    c = tracking.client()
    exp = c.create_experiment("79_pace_store")
    here = {"host.label": "box-a", "host.cpu_id": "GenuineIntel family 6 model 207"}

    def run(tags: dict, sweep_s: float | None, status="FINISHED") -> str:
        rid = c.create_run(exp, tags={"recipe.reproduce_hash": "h1", **here, **tags}).info.run_id
        if sweep_s is not None:
            nb = {"cells": [{"cell_type": "code", "metadata": {"papermill": {"duration": d}}}
                            for d in (0.1, 2.0, sweep_s)]}
            c.log_text(rid, json.dumps(nb), "notebook/79_pace.ipynb")
        c.set_terminated(rid, status)
        time.sleep(0.01)  # distinct start times
        return rid

    run({"lab.id": "LAB:79-h1-right"}, 600.0)
    run({"lab.id": "LAB:79-h1-other", "host.cpu_id": "AuthenticAMD family 26 model 2"}, 300.0)
    run({"lab.id": "LAB:79-h1-resum", "resume.from": "LAB:79-h1-killd"}, 40.0)
    run({"lab.id": "LAB:79-h2-recip", "recipe.reproduce_hash": "h2"}, 900.0)
    now = c.create_run(exp, tags={"recipe.reproduce_hash": "h1", **here}).info.run_id
    p = pace.previous(c, now, "79_pace")
    assert p is not None and p.source == "LAB:79-h1-right" and p.cells == (0.1, 2.0, 600.0), p
    assert p.start_line_of(2, 3) == "cell 3/3 running; it took 10m00s in [LAB:79-h1-right]"


@pytest.mark.slow  # papermill, twice
def test_a_second_run_says_what_the_last_one_took_and_the_time_left(store, nb_dir, tmp_path):
    """No estimate on a notebook's first run here; on the next, the last run's total at the
    start and, after each cell, what its later cells took then."""
    _write_nb(nb_dir / "79_pace.ipynb", ['recipe = "default"', START, "import time\ntime.sleep(3)",
                                         "lab.metric('x', 1.0)"])
    _write_nb(nb_dir / "80_after.ipynb", ['recipe = "default"', START])
    said: list[list[str]] = [[], []]
    ids = []
    for i in range(2):
        s = rp.reproduce(only=["79", "80"], out_dir=str(tmp_path / f"out{i}"), progress=said[i].append)
        assert s["ok"], [r["error"] for r in s["results"]]
        ids.append(s["results"][0]["id"])
        # a downstream notebook's session records the 02 run it read in its recipe (08's sweep),
        # so its effective hash moves with every new 02 run: the pace must not depend on it
        tracking.client().set_tag(s["results"][0]["run_id"], "recipe.effective_hash", f"with-sweep-{i}")
    first, second = said
    assert not any("last time here" in m or " left" in m for m in first), first
    # the whole reproduction first: what the last one of these two notebooks took, and where it is
    out0 = re.escape(str(tmp_path / "out0"))
    assert any(re.fullmatch(rf"2 notebooks; last time here they took 0m[0-5]\ds in all \({out0}\)", m)
               for m in second), second
    start = next(m for m in second if m.startswith("79_pace: running as"))
    assert f"running as [{ids[1]}]; last time here its cells took 0m0" in start and f"[{ids[0]}]" in start, start
    # papermill's injected parameters cell makes five code cells: the 3-s sleep is the fourth
    assert any(re.fullmatch(r"79_pace: cell 3/5 done \(\d+\.\d s\) · about 0m0[3-9]s left", m) for m in second), second
    assert any(re.fullmatch(r"79_pace: cell 5/5 done \(\d+\.\d s\)", m) for m in second), second


@pytest.mark.slow  # papermill
def test_a_notebook_kernel_skips_the_last_collection_at_exit(store, nb_dir, tmp_path):
    """labkit.teardown: lab.start() registers gc.freeze() as the kernel's exit handler; a
    handler the notebook registered before start() runs after it and finds the survivors
    frozen, and the run is closed and recorded as before."""
    seen = tmp_path / "freeze-count"
    _write_nb(nb_dir / "78_exit.ipynb", [
        'recipe = "default"',
        f"import atexit, gc\natexit.register(lambda p={str(seen)!r}, n=gc.get_freeze_count: open(p, 'w').write(str(n())))",
        START, "lab.metric('x', 1.0)"])
    s = rp.reproduce(only=["78"], out_dir=str(tmp_path / "out"))
    assert s["ok"], s["results"][0]["error"]
    assert int(seen.read_text()) > 10_000  # MLflow, pandas, matplotlib, labkit: far more objects than that
    run = tracking.client().get_run(s["results"][0]["run_id"])
    assert run.info.status == "FINISHED" and run.data.metrics["x"] == 1.0
    assert procs.kernels(os.getpid()) == []


@pytest.mark.slow  # papermill
def test_whole_run_limit_stops_the_reproduction_and_skips_the_rest(store, nb_dir, tmp_path):
    _write_nb(nb_dir / "82_slow.ipynb", [
        'recipe = "default"', START, "import time\ntime.sleep(1)\nlab.metric('step1', 1.0)",
        "time.sleep(1)\nlab.metric('step2', 1.0)", "time.sleep(150)\nlab.metric('step3', 1.0)"])
    _write_nb(nb_dir / "83_after.ipynb", ['recipe = "default"', START])
    # kernel start + the start cell + two 1-s cells take ~6 s on a 2-core box (~12 s on the
    # slowest we have seen): the limit lands in the 150-s cell
    recipe = tiny.recipe_file(tmp_path / "tiny.yaml", cell_timeout_s=500, run_timeout_s=20)
    t0 = time.monotonic()
    summary = rp.reproduce(recipe=recipe, only=["82", "83"], out_dir=str(tmp_path / "out"))
    assert time.monotonic() - t0 < 120
    first, second = summary["results"]
    assert first["status"] == "FAILED" and "whole-run limit" in first["error"]
    assert second["status"] == "SKIPPED" and second["run_id"] is None
    metrics = tracking.client().get_run(first["run_id"]).data.metrics
    assert "step1" in metrics and "step3" not in metrics
    assert procs.kernels(os.getpid()) == []


# -- SIGTERM ----------------------------------------------------------------------------------
def _signal_when_sleeping(p: subprocess.Popen, c, stem: str, sig: int) -> tuple:
    """Wait (bounded) until reproduction ``p`` runs ``stem``'s third cell (a long sleep), send
    ``sig``; return the run, the kernels under ``p`` then, and its stdout and stderr."""
    try:
        deadline, run = time.monotonic() + 240, None
        while time.monotonic() < deadline and p.poll() is None:
            runs = [r for r in _runs(c) if r.data.tags.get("lab.notebook") == stem]
            if runs and runs[0].info.status == "RUNNING" and int(runs[0].data.tags.get("lab.cells", 0)) >= 3:
                run = runs[0]
                break
            time.sleep(0.5)
        assert run is not None, "the run never got going: " + ("" if p.poll() is None else p.communicate()[1][-3000:])
        time.sleep(1)  # into the sleeping cell
        kernels = procs.kernels(p.pid)
        assert kernels, "no kernel under the reproduction"
        p.send_signal(sig)
        out, err = p.communicate(timeout=90)
    finally:
        if p.poll() is None:
            p.kill()
            p.communicate()
    return run, kernels, out, err


@pytest.mark.slow  # papermill
def test_sigterm_marks_the_run_killed_uploads_its_records_and_leaves_no_kernel(store, nb_dir, tmp_path):
    _write_nb(nb_dir / "84_term.ipynb", [
        'recipe = "default"', START, "lab.metric('before_term', 1.0)",
        "import time\nprint('waiting for SIGTERM', flush=True)\ntime.sleep(300)", "lab.metric('never', 1.0)"])
    p = _cli("--only", "84", "--out", str(tmp_path / "out"), env=_env(
        LABKIT_NOTEBOOKS=str(nb_dir), LABKIT_ROOT=str(tmp_path / "root")))
    c = tracking.client()
    run, kernels, out, err = _signal_when_sleeping(p, c, "84_term", signal.SIGTERM)
    assert p.returncode == 143, err[-2000:]
    assert "terminated (SIGTERM)" in err
    assert "84_term: cell 5/6 interrupted (" in err and "cell 5/6 done" not in err
    summary = json.loads(out.strip().splitlines()[-1])
    assert summary["interrupted"] == "Terminated" and summary["ok"] is False
    final = c.get_run(run.info.run_id)
    assert final.info.status == "KILLED" and "interrupted" in final.data.tags["lab.error"]
    assert final.data.metrics["before_term"] == 1.0 and "never" not in final.data.metrics
    logged = {a.path for a in c.list_artifacts(run.info.run_id, "notebook")}
    assert {"notebook/84_term.ipynb", "notebook/84_term.cells.jsonl"} <= logged
    assert not procs.wait_gone(kernels, 20), f"kernel left running: {kernels}"


@pytest.mark.slow  # papermill
def test_kill_int_stops_a_reproduction_started_in_the_background(store, nb_dir, tmp_path):
    """`nohup labkit reproduce &` (or `cmd &` in a script) starts with SIGINT ignored; `kill -INT`
    must still interrupt it like Ctrl-C: exit 130, the run KILLED, what it logged kept."""
    _write_nb(nb_dir / "89_int.ipynb", [
        'recipe = "default"', START, "lab.metric('before_int', 1.0)",
        "import time\ntime.sleep(300)", "lab.metric('never', 1.0)"])
    p = _cli("--only", "89", "--out", str(tmp_path / "out"), env=_env(
        LABKIT_NOTEBOOKS=str(nb_dir), LABKIT_ROOT=str(tmp_path / "root")),
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_IGN))  # as a background job inherits it
    c = tracking.client()
    run, kernels, out, err = _signal_when_sleeping(p, c, "89_int", signal.SIGINT)
    assert p.returncode == 130, err[-2000:]
    final = c.get_run(run.info.run_id)
    assert final.info.status == "KILLED" and final.data.metrics["before_int"] == 1.0
    assert "never" not in final.data.metrics
    assert not procs.wait_gone(kernels, 20), f"kernel left running: {kernels}"


# -- one reproduction at a time, its own folder ---------------------------------------------------
def test_output_folders_are_unique_within_one_second(tmp_path):
    now = time.time()
    a = runlock.output_folder("default", root=tmp_path, now=now)
    b = runlock.output_folder("default", root=tmp_path, now=now)
    assert a != b and a.is_dir() and b.is_dir() and a.name[:15] == b.name[:15]


@pytest.mark.slow  # papermill
def test_a_team_server_locks_per_host_label_and_a_sqlite_store_per_file(tmp_path, monkeypatch):
    from labkit.provenance import runlock

    monkeypatch.setenv("LABKIT_HOST_LABEL", "host-a")
    a = runlock.lock_paths("http://127.0.0.1:5005")
    assert a == runlock.lock_paths("http://127.0.0.1:5005") and a[0].name == runlock.LOCK_NAME
    assert a[1] != runlock.lock_paths("http://127.0.0.1:5006")[1]  # another server
    monkeypatch.setenv("LABKIT_HOST_LABEL", "host-b")
    assert runlock.lock_paths("http://127.0.0.1:5005")[1] != a[1]  # another host on the same server
    db = tmp_path / "mlflow.db"
    assert runlock.lock_paths(f"sqlite:///{db}")[1] == db.with_name("mlflow.db" + runlock.LOCK_NAME)


@pytest.mark.slow  # two papermill reproductions
def test_two_reproductions_started_in_the_same_second_never_mix(store, nb_dir, tmp_path):
    _write_nb(nb_dir / "85_pair.ipynb", [
        'recipe = "default"\nwho = "nobody"', START, "import time\ntime.sleep(4)\nlab.metric('done', 1.0)"])
    root = tmp_path / "root"
    env = _env(LABKIT_NOTEBOOKS=str(nb_dir), LABKIT_ROOT=str(root))
    # started together, no --wait: exactly one runs, the other refuses naming it
    procs = [_cli("--only", "85", "-p", f'who="{w}"', env=env) for w in ("a", "b")]
    try:
        res = [(p.pid, p.wait(timeout=300), *p.communicate()) for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
    codes = sorted(r[1] for r in res)
    assert codes == [0, 2], [r[3][-1500:] for r in res]
    winner = next(r for r in res if r[1] == 0)
    loser = next(r for r in res if r[1] == 2)
    assert "another reproduction is running" in loser[3] and f"pid {winner[0]}" in loser[3]
    assert "LAB:85-" in loser[3] or "no notebook yet" in loser[3]
    # with --wait the second queues behind the first; each has its own folder and records
    procs = [_cli("--only", "85", "-p", f'who="{w}"', "--wait", "240", env=env) for w in ("c", "d")]
    try:
        res = [(p.wait(timeout=400), *p.communicate()) for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
    assert [r[0] for r in res] == [0, 0], [r[2][-1500:] for r in res]
    sums = [json.loads(r[1].strip().splitlines()[-1]) for r in res]
    outs = {s["output"] for s in sums}
    assert len(outs) == 2
    for s in sums:
        journal = Path(s["output"]) / "85_pair.cells.jsonl"
        runs = {json.loads(line)["run"] for line in journal.read_text().splitlines()}
        assert runs == {s["results"][0]["id"].split(":", 1)[1]}  # only its own run's records
    c = tracking.client()
    (a, b) = (c.get_run(s["results"][0]["run_id"]) for s in sums)
    # serialized: one ended before the other started
    assert a.info.end_time <= b.info.start_time or b.info.end_time <= a.info.start_time


# -- a busy box ----------------------------------------------------------------------------------
def test_machine_state_counts_other_processes_and_not_our_own(tmp_path):
    a = machine_state.snapshot()
    pids = _spin_elsewhere(tmp_path, 2, wall=60, cpu=1.5)  # two other jobs, 1.5 s of CPU each
    try:
        while any(procs.alive(p) for p in pids):
            time.sleep(0.1)
    finally:
        _stop(pids)
    s = machine_state.between(a, machine_state.snapshot())
    assert s["machine.others_cpu_s"] >= 2.9 and s["machine.own_cpu_s"] < 1.0
    assert 0 < s["machine.busy"] <= 1 and s["machine.cpus"] == os.cpu_count()
    # our own child's CPU time is ours, even after it has exited
    a = machine_state.snapshot()
    subprocess.run([sys.executable, "-c", SPIN, str(tmp_path / "own.pids"), "60", "1.0"], check=True, timeout=120)
    s = machine_state.between(a, machine_state.snapshot())
    assert s["machine.own_cpu_s"] >= 0.95


@pytest.mark.slow  # papermill
def test_busy_box_is_refused_by_max_busy_and_flagged_in_the_drift_report(store, nb_dir, tmp_path):
    _write_nb(nb_dir / "86_busy.ipynb", ['recipe = "default"\nvalue = 1.0', START, "lab.metric('value', value)"])
    c = tracking.client()
    pids = _spin_elsewhere(tmp_path, 2, wall=240, cpu=240)  # both cores, until stopped
    try:
        before = len(_runs(c))
        with pytest.raises(LabkitError, match="the machine is busy") as e:
            rp.reproduce(recipe=tiny.recipe_file(tmp_path / "strict.yaml", max_busy=0.2), only=["86"])
        assert "python" in e.value.problem and e.value.fix
        assert len(_runs(c)) == before  # refused before anything was recorded
        recipe = tiny.recipe_file(tmp_path / "tiny.yaml")
        first = rp.reproduce(recipe=recipe, only=["86"], params={"value": 1.0})
        second = rp.reproduce(recipe=recipe, only=["86"], params={"value": 2.0})
    finally:
        _stop(pids)
    assert first["ok"] and second["ok"]
    r = second["results"][0]
    tags = c.get_run(r["run_id"]).data.tags
    assert tags["machine.contended"] == "true" and float(tags["machine.busy"]) > machine_state.CONTENDED
    comp = r["comparison"]
    assert [m["metric"] for m in comp["moved"]] == ["value"]
    assert comp["contended"] and f"this run [{r['id']}]" in comp["contended"]


def test_results_matrix_shows_a_contended_sweep(store):
    """SYNTHETIC: a k-sweep run recorded by hand (tags and its sweep-cells table), read back."""
    import pandas as pd

    from labkit.provenance import frames
    from labkit.report.matrix import results_matrix

    c = tracking.client()
    rid = c.create_run(tracking.experiment_id(c, "02_k_sweep"), tags={
        "recipe": "synthetic", "recipe.effective_hash": "feedfeedfeed", "lab.id": "LAB:02-feedfe-aaaaa",
        "machine.busy": "0.63", "machine.contended": "true"}).info.run_id
    cells = pd.DataFrame({"temperature": [0.0, 0.0], "workload": ["edit", "edit"], "drafter": ["none", "ngram"],
                          "k": [0, 3], "tok_s": [10.0, 15.0], "tok_s_min": [9.0, 14.0], "tok_s_max": [11.0, 16.0],
                          "speedup": [1.0, 1.5], "speedup_min": [1.0, 1.4], "speedup_max": [1.0, 1.6]})
    runs = pd.DataFrame({"temperature": [0.0, 0.0], "cold": [False, False], "workload": ["edit", "edit"],
                         "drafter": ["none", "ngram"], "k": [0, 3], "drafts_reaching_pos": [[], [10, 8, 6]],
                         "acc_pos": [[], [8, 6, 4]], "drafted": [0, 24], "accepted": [0, 18],
                         "ttft_ms": [50.0, 50.0], "prompt_tokens": [100, 100]})
    c.log_text(rid, frames.frame_to_json(cells), "tables/sweep-cells/data.json")
    c.log_text(rid, frames.frame_to_json(runs), "tables/sweep-runs/data.json")
    c.set_terminated(rid, "FINISHED")
    m = results_matrix(c)
    assert m.set_index("source").loc["LAB:02-feedfe-aaaaa", "box"] == "63% by others, CONTENDED"


# -- drift that pages, progress on stderr ------------------------------------------------------
def test_the_terminal_relays_a_notebooks_lines_but_thins_its_counters(capsys):
    """What the terminal shows of a kernel's lines: every line, except ArmBook's counts (the
    journal watcher says them with the time) and, of a counter of items, one line per label
    every 15 s."""
    from labkit.provenance.execution import _Lines

    now = [0.0]
    said: dict = {}
    out, err = _Lines("02", said, clock=lambda: now[0]), _Lines("02", said, clock=lambda: now[0])
    for t, sink, line in [
        (0.0, out, "replay: edit-01 (1/40), 64 plain tokens"), (3.0, out, "replay: edit-04 (2/40), 64 plain tokens"),
        (4.0, err, "arms sweep: 1/10 · ETA 0m11s"), (4.5, err, "arms sweep: 9 inherited from LAB:02-abcdef-xyz12"),
        (5.0, out, "k sweep: code-07 T=0.0 run 1/1 (1/2)"), (6.0, out, "search: code: on, ngram k=3, 1.20× (1.06–1.36)"),
        (9.0, out, "k sweep: code-10 T=0.0 run 1/1 (2/2)"), (15.0, out, "replay: edit-07 (3/40), 64 plain tokens"),
        (20.0, out, "k sweep: code-11 T=0.0 run 2/2 (1/6)"), (21.0, out, "arm 2/2"),
    ]:
        now[0] = t
        sink.write(line + "\n")
    relayed = [x.split("| ", 1)[1] for x in capsys.readouterr().err.splitlines()]
    assert relayed == ["replay: edit-01 (1/40), 64 plain tokens", "arms sweep: 9 inherited from LAB:02-abcdef-xyz12",
                       "k sweep: code-07 T=0.0 run 1/1 (1/2)", "search: code: on, ngram k=3, 1.20× (1.06–1.36)",
                       "replay: edit-07 (3/40), 64 plain tokens", "k sweep: code-11 T=0.0 run 2/2 (1/6)", "arm 2/2"]


@pytest.mark.slow  # papermill
def test_fail_on_moved_exits_3_and_progress_shows_cells_and_printed_lines(store, nb_dir, tmp_path):
    _write_nb(nb_dir / "87_moves.ipynb", [
        'recipe = "default"\nvalue = 1.0', START,
        "import sys\nprint('arm 1/2', flush=True)\nprint('arm 2/2', flush=True)\n"
        "for i in range(1, 6):\n    print(f'replay: p-{i} ({i}/5)', flush=True)\n"
        "print('arms demo: 3/5 · ETA 0m01s', file=sys.stderr, flush=True)", "lab.metric('value', value)"])
    env = _env(LABKIT_NOTEBOOKS=str(nb_dir), LABKIT_ROOT=str(tmp_path / "root"))
    assert rp.reproduce(only=["87"], params={"value": 1.0})["ok"]
    same = _cli("--only", "87", "-p", "value=1.0", "--fail-on-moved", env=env)
    out, err = same.communicate(timeout=300)
    assert same.returncode == 0, err[-2000:]
    # 5 code cells: papermill injects one after the parameters cell
    assert "87_moves: cell 1/5 done" in err and "87_moves: cell 5/5 done" in err
    assert err.index("87_moves| arm 1/2") < err.index("87_moves| arm 2/2") < err.index("87_moves: cell 4/5 done")
    assert "arm 2/2" not in out  # stdout is the JSON only
    # the kernel's sockets are CurveZMQ-encrypted, so ipykernel has no plain-TCP warning to
    # print; mlflow's system-metrics monitor keeps its INFO lines to itself
    assert "[IPKernelApp]" not in err and "mlflow.system_metrics" not in err, err[-2000:]
    # a counter of items says its first line (the next comes 15 s later); an ArmBook count is
    # the journal watcher's to say; the executed notebook keeps every line
    assert "87_moves| replay: p-1 (1/5)" in err and "p-2 (2/5)" not in err and "arms demo" not in err, err[-2000:]
    moved = _cli("--only", "87", "-p", "value=5.0", "--fail-on-moved", env=env)
    out, err = moved.communicate(timeout=300)
    assert moved.returncode == 3, err[-2000:]
    assert "MOVED value: 1 -> 5" in err and json.loads(out.strip().splitlines()[-1])["moved"] == 1


# -- the committed notebooks ------------------------------------------------------------------------
def _clone(tmp_path: Path) -> Path:
    clone = tmp_path / "clone"
    subprocess.run(["git", "clone", "-q", str(ROOT), str(clone)], check=True, timeout=120)
    return clone


@pytest.mark.slow  # papermill
def test_reproduce_refuses_uncommitted_notebooks_unless_allow_dirty(store, tmp_path, monkeypatch):
    clone = _clone(tmp_path)
    monkeypatch.setenv("LABKIT_ROOT", str(clone))
    monkeypatch.delenv("LABKIT_NOTEBOOKS", raising=False)
    c = tracking.client()
    before = len(_runs(c))
    # JupyterLab's autosave: the paired .py gained tiny parameters
    py = clone / "notebooks" / "02_k_sweep.py"
    py.write_text(py.read_text().replace('recipe = "default"', 'recipe = "default"\nruns = 1', 1))
    with pytest.raises(LabkitError, match=r"notebooks/02_k_sweep\.py") as e:
        rp.reproduce(only=["02"], params=SWEEP_FAST)  # tiny, should the check ever let it through
    assert "--allow-dirty" in e.value.fix
    subprocess.run(["git", "-C", str(clone), "checkout", "--", "notebooks/02_k_sweep.py"], check=True)
    # ... and the .ipynb gained outputs
    ipynb = clone / "notebooks" / "01_cost_fit.ipynb"
    nb = nbformat.read(ipynb, as_version=4)
    nb.cells[1].outputs = [nbformat.v4.new_output("stream", name="stdout", text="saved output\n")]
    nbformat.write(nb, ipynb)
    with pytest.raises(LabkitError, match=r"notebooks/01_cost_fit\.ipynb"):
        rp.reproduce(only=["01"], params=FAST)
    assert len(_runs(c)) == before  # nothing recorded
    # a committed SYNTHETIC notebook runs as committed; changed, only with allow_dirty, recorded
    tiny = _write_nb(clone / "notebooks" / "88_tiny.ipynb", ['recipe = "default"', START, "lab.metric('x', 1.0)"])
    git = ["git", "-C", str(clone), "-c", "user.name=t", "-c", "user.email=t@t"]
    with pytest.raises(LabkitError, match="88_tiny.ipynb"):  # untracked is uncommitted too
        rp.reproduce(only=["88"])
    subprocess.run([*git, "add", str(tiny)], check=True)
    subprocess.run([*git, "commit", "-qm", "tiny"], check=True)
    clean = rp.reproduce(only=["88"], out_dir=str(tmp_path / "o1"))
    tags = c.get_run(clean["results"][0]["run_id"]).data.tags
    assert tags["lab.notebook_git"] == "committed" and tags["lab.allow_dirty"] == "false"
    _write_nb(tiny, ['recipe = "default"', START, "lab.metric('x', 2.0)"])
    with pytest.raises(LabkitError, match="88_tiny.ipynb"):
        rp.reproduce(only=["88"])
    dirty = rp.reproduce(only=["88"], out_dir=str(tmp_path / "o2"), allow_dirty=True)
    tags = c.get_run(dirty["results"][0]["run_id"]).data.tags
    assert tags["lab.notebook_git"] == "uncommitted" and tags["lab.allow_dirty"] == "true"
    assert tags["lab.dirty_files"] == "notebooks/88_tiny.ipynb"


# -- the shipped schedule, run as written ----------------------------------------------------------
def _unit(path: Path) -> dict[str, list[str]]:
    out: dict[str, list[str]] = {}
    for line in path.read_text().splitlines():
        if "=" in line and not line.lstrip().startswith(("#", ";", "[")):
            k, v = line.split("=", 1)
            out.setdefault(k.strip(), []).append(v.strip())
    return out


def _systemd_expand(value: str, home: Path, env: dict) -> list[str]:
    """ExecStart as systemd reads it: %h, then ${VAR} (one word) and $VAR (split)."""
    value = value.replace("%h", str(home))
    words = []
    for w in shlex.split(value):
        if re.fullmatch(r"\$[A-Za-z_]\w*", w):
            words += env.get(w[1:], "").split()
        else:
            words.append(re.sub(r"\$\{(\w+)\}", lambda m: env.get(m.group(1), ""), w))
    return words


@pytest.mark.slow  # papermill end to end: 01 through the unit, a notebook through cron
def test_systemd_unit_and_crontab_run_as_written(store, tmp_path):
    home = tmp_path / "home"
    home.mkdir()
    clone = _clone(tmp_path)
    (home / "labkit").symlink_to(clone)
    (clone / ".venv").symlink_to(Path(sys.executable).parents[1])  # the venv running this test
    svc = _unit(ROOT / "deploy" / "labkit-reproduce.service")
    timer = _unit(ROOT / "deploy" / "labkit-reproduce.timer")
    assert timer["Unit"] == ["labkit-reproduce.service"] and timer["OnCalendar"]
    assert svc["KillSignal"] == ["SIGTERM"] and svc["Type"] == ["oneshot"]
    env = _env(HOME=str(home))
    for e in svc.get("Environment", []):
        k, v = e.split("=", 1)
        env[k] = v
    # the operator's override (`systemctl --user edit`): a tiny recipe, as a drop-in would set it
    env["LABKIT_RECIPE"] = tiny.recipe_file(tmp_path / "tiny.yaml", notebooks=["01_cost_fit"], cost_models=[], **FAST)
    cwd = svc["WorkingDirectory"][0].replace("%h", str(home))
    cmd = _systemd_expand(svc["ExecStart"][0], home, env)
    assert cmd[0] == str(home / "labkit" / ".venv" / "bin" / "labkit")
    p = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=900)
    assert p.returncode == 0, p.stderr[-3000:]
    summary = _record(p.stderr)  # the terminal ends with the human summary, naming summary.json
    assert summary["ok"] and Path(summary["output"]).parent == clone / "runs"
    # ExecStopPost: retention keeps the newest LABKIT_KEEP_RUNS folders
    older = [clone / "runs" / f"2001010{i}-000000-default-beef" for i in (1, 2)]  # SYNTHETIC old folders
    for d in older:
        d.mkdir()
    post = _systemd_expand(svc["ExecStopPost"][0], home, env)
    p = subprocess.run(post, cwd=cwd, env={**env, "LABKIT_KEEP_RUNS": "2"}, capture_output=True, text=True,
                       timeout=60)
    assert p.returncode == 0, p.stderr
    assert Path(summary["output"]).is_dir() and older[1].is_dir() and not older[0].exists()
    # the crontab line, through /bin/sh as cron runs it, with cron's bare environment (and, to
    # keep it short, a SYNTHETIC one-cell notebook instead of 01)
    nbs = tmp_path / "cron-notebooks"
    nbs.mkdir()
    _write_nb(nbs / "89_cron.ipynb", ['recipe = "default"', START, "lab.metric('x', 1.0)"])
    line = next(x for x in (ROOT / "deploy" / "crontab").read_text().splitlines()
                if x.strip() and not x.lstrip().startswith("#") and not re.match(r"^\w+=", x))
    command = line.split(None, 5)[5]
    assert "%" not in command  # cron would cut the line there
    cron_env = {"HOME": str(home), "PATH": "/usr/bin:/bin", "SHELL": "/bin/sh", "LOGNAME": "root",
                "PYTHONPATH": SRC, "LABKIT_RECIPE": tiny.recipe_file(tmp_path / "cron.yaml", notebooks=["89_cron"]),
                "LABKIT_NOTEBOOKS": str(nbs), "LABKIT_KEEP_RUNS": "30",
                "MLFLOW_TRACKING_URI": os.environ["MLFLOW_TRACKING_URI"], "LABKIT_CACHE": env["LABKIT_CACHE"]}
    p = subprocess.run(["/bin/sh", "-c", command], env=cron_env, capture_output=True, text=True, timeout=900)
    log = (clone / "runs" / "reproduce.log").read_text()
    assert p.returncode == 0, log[-3000:]
    last = _record(log)
    assert last["ok"] and last["output"] != summary["output"]
    assert "[prune-runs] kept newest 30" in log
