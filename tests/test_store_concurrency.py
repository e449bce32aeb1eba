"""Many writers, one SQLite lab book: two processes log into one new store at once.

Each writer is a separate Python process using labkit's own tracking client, as two
`labkit reproduce` runs (or a reproduction and a JupyterLab notebook) on one machine do.
They start together on a file that does not exist yet (the table-creation race) and then
write as fast as they can (the lock race). Both must finish, and every run, metric, tag
and artifact either wrote must be in the store.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

N_RUNS, N_METRICS = 3, 40

WRITER = r"""
import json, sys, time
from pathlib import Path
from labkit.config.recipe import load
from labkit.provenance import tracking

name, go = sys.argv[1], Path(sys.argv[2])
n_runs, n_metrics = int(sys.argv[3]), int(sys.argv[4])
while not go.exists():
    time.sleep(0.005)
c = tracking.client()
recipe = load(None)
done = []
for i in range(n_runs):
    rid, lab = tracking.new_run(c, notebook="09_concurrency", recipe=recipe, tags={"writer": name})
    for j in range(n_metrics):
        c.log_metric(rid, "x", float(j), step=j)
        c.set_tag(rid, f"t{j % 5}", f"{name}-{j}")
    c.log_text(rid, name, f"cells/{name}.txt")
    c.set_terminated(rid, "FINISHED")
    done.append({"run_id": rid, "lab": str(lab)})
print(json.dumps(done))
"""


def _writers(tmp_path: Path, uri: str, n: int = 2) -> list[subprocess.CompletedProcess]:
    script = tmp_path / "writer.py"
    script.write_text(WRITER)
    go = tmp_path / "go"
    env = {**os.environ, "MLFLOW_TRACKING_URI": uri, "PYTHONPATH": os.pathsep.join(sys.path)}
    procs = [subprocess.Popen([sys.executable, str(script), f"w{i}", str(go), str(N_RUNS), str(N_METRICS)],
                              env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for i in range(n)]
    try:
        time.sleep(3)  # both imported and waiting: release them together
        go.touch()
        outs = [p.communicate(timeout=300) for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
    return [subprocess.CompletedProcess(p.args, p.returncode, o, e) for p, (o, e) in zip(procs, outs)]


@pytest.mark.slow
def test_two_writers_on_one_new_sqlite_store_lose_nothing(tmp_path):
    db = tmp_path / "lab" / "mlflow.db"
    uri = f"sqlite:///{db}"
    results = _writers(tmp_path, uri)
    for r in results:
        assert r.returncode == 0, r.stderr[-3000:]
        assert "database is locked" not in r.stderr
    written = [json.loads(r.stdout.strip().splitlines()[-1]) for r in results]
    from mlflow.tracking import MlflowClient

    c = MlflowClient(tracking_uri=uri)
    ids = [w["run_id"] for ws in written for w in ws]
    labs = [w["lab"] for ws in written for w in ws]
    assert len(set(ids)) == len(ids) == 2 * N_RUNS and len(set(labs)) == len(labs)
    for i, ws in enumerate(written):
        for w in ws:
            run = c.get_run(w["run_id"])
            assert run.info.status == "FINISHED" and run.data.tags["writer"] == f"w{i}"
            assert sorted(m.step for m in c.get_metric_history(w["run_id"], "x")) == list(range(N_METRICS))
            assert run.data.tags["t4"] == f"w{i}-{N_METRICS - 1}"
            assert [a.path for a in c.list_artifacts(w["run_id"], "cells")] == [f"cells/w{i}.txt"]
    # one experiment, however the two raced to create it; the file is in WAL mode
    assert len([e for e in c.search_experiments() if e.name == "09_concurrency"]) == 1
    import sqlite3

    assert sqlite3.connect(db).execute("PRAGMA journal_mode").fetchone()[0] == "wal"


@pytest.mark.slow  # a CLI process: ~3-5 s of imports
def test_a_first_command_on_a_new_store_prints_its_answer_not_mlflows_table_creation(tmp_path):
    db = tmp_path / "new" / "mlflow.db"
    env = {**os.environ, "MLFLOW_TRACKING_URI": f"sqlite:///{db}"}
    r = subprocess.run([sys.executable, "-m", "labkit.cli", "advise"], env=env, capture_output=True,
                       text=True, timeout=120)
    assert r.returncode == 2 and db.exists(), r.stderr[-2000:]
    # the answer (no sweep yet, and how to make one) is all it says
    assert r.stderr.startswith("labkit advise: error: no finished 02_k_sweep run"), r.stderr[-2000:]
    assert "mlflow.store.db.utils" not in r.stderr and "database tables" not in r.stderr
