"""Many machines, one lab book: the team server, hosts side by side, a server that goes away.

The end-to-end test starts the team server as `make team-server` does (real PostgreSQL,
real `mlflow server --serve-artifacts`, on 127.0.0.1, always stopped), runs two small
reproductions at once from two separate clones with two host labels, and reads each
one's results from the other clone. The server-down test stops a real `mlflow server`
in the middle of a notebook and replays the journal with `labkit sync` once it is back.
"""

from __future__ import annotations

import glob
import json
import os
import platform
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

import nbformat
import pytest

import tiny
from labkit.config.recipe import load
from labkit.errors import LabkitError
from labkit.paths import project_root
from labkit.provenance import fingerprint, runtags, tracking
from labkit.provenance.drift import compare_with_previous
from labkit.report import queries
from labkit.report.compare import compare, render

ROOT = project_root()
TINY = tiny.as_cli({**tiny.FAST_01, "cost_models": []})


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _healthy(url: str) -> bool:
    try:
        urllib.request.urlopen(url + "/health", timeout=2)
        return True
    except OSError:
        return False


def _cli(args: list[str], *, env: dict, cwd: Path, timeout: int = 900) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "labkit.cli", *args], env=env, cwd=cwd, capture_output=True,
                          text=True, timeout=timeout)


def _last_json(r: subprocess.CompletedProcess):
    return json.loads(r.stdout.strip().splitlines()[-1])


def _env(root: Path, uri: str, **extra) -> dict:
    return {**os.environ, "PYTHONPATH": str(root / "src"), "LABKIT_ROOT": str(root), "MLFLOW_TRACKING_URI": uri,
            **extra}


def _code_cells(executed: str) -> int:
    return sum(c.cell_type == "code" for c in nbformat.read(executed, as_version=4).cells)


# -- host fingerprint ------------------------------------------------------------------------
def test_power_source_from_linux_sysfs(tmp_path):
    """SYNTHETIC /sys/class/power_supply trees: mains online, on battery, a server with none."""
    def supply(root, name, **files):
        d = root / name
        d.mkdir(parents=True)
        for k, v in files.items():
            (d / k).write_text(v + "\n")

    supply(tmp_path / "ac", "AC", type="Mains", online="1")
    supply(tmp_path / "ac", "BAT0", type="Battery", status="Charging", capacity="55")
    supply(tmp_path / "bat", "AC", type="Mains", online="0")
    supply(tmp_path / "bat", "BAT0", type="Battery", status="Discharging", capacity="80")
    (tmp_path / "none").mkdir()
    if sys.platform == "darwin":
        pytest.skip("macOS reads pmset, not sysfs")
    assert fingerprint.power_source(sysfs=str(tmp_path / "ac")) == "mains"
    assert fingerprint.power_source(sysfs=str(tmp_path / "bat")) == "battery (80%)"
    assert fingerprint.power_source(sysfs=str(tmp_path / "none")) is None
    assert fingerprint.power_source(sysfs=str(tmp_path / "absent")) is None


@pytest.mark.slow  # ~20 s on a 2-core box: fingerprint.collect of the real host and build
def test_every_run_records_host_label_accelerator_and_build(monkeypatch):
    monkeypatch.setenv("LABKIT_HOST_LABEL", "gpu-box")
    tags = runtags.flat_tags(fingerprint.collect(recipe=load(None)))
    assert tags["host.label"] == "gpu-box" and tags["host.label_source"] == "LABKIT_HOST_LABEL"
    assert tags["host.accelerator"] == fingerprint.accelerator()
    if shutil.which("nvidia-smi") is None and sys.platform != "darwin":
        assert tags["host.accelerator"] == "none"
    monkeypatch.delenv("LABKIT_HOST_LABEL")
    assert runtags.flat_tags(fingerprint.collect())["host.label"] == platform.node()
    desc = {"engine": "llama.cpp", "build": {"llama_cpp_python": "0.3.36", "llama_cpp_commit": "0c1e570abc",
                                             "cmake_args": "-DGGML_AVX2=ON"}}
    b1 = runtags.engine_tags(desc)["engine.build"]
    desc["build"]["cmake_args"] = "-DGGML_NATIVE=ON"
    b2 = runtags.engine_tags(desc)["engine.build"]
    assert b1.startswith("llama.cpp-0.3.36-0c1e570-") and b1 != b2  # other flags, another build


# -- per host and build: latest, previous, compare ---------------------------------------------
def _fake_run(c, *, host: str, build: str, h_ms: float, recipe=None):
    """A SYNTHETIC finished 01_cost_fit run: real store, made-up host/build tags and metric."""
    recipe = recipe or load(None)
    rid, lab = tracking.new_run(c, notebook="01_cost_fit.ipynb", recipe=recipe,
                                tags={"host.label": host, "engine.build": build, "recipe": recipe.name,
                                      "recipe.effective_hash": recipe.hash, "synthetic": "true"})
    c.log_metric(rid, "H_ms", h_ms)
    c.set_terminated(rid, "FINISHED")
    time.sleep(0.02)  # distinct start times
    return {"run_id": rid, "id": str(lab), "recipe_hash": recipe.hash}


def test_latest_and_previous_are_per_host_and_build(store, monkeypatch):
    monkeypatch.setenv("LABKIT_HOST_LABEL", "linux-box")
    c = tracking.client()
    old = _fake_run(c, host="linux-box", build="b1", h_ms=20.0)
    mac = _fake_run(c, host="mac-mini", build="b9", h_ms=10.0)
    other_build = _fake_run(c, host="linux-box", build="b2", h_ms=40.0)
    new = _fake_run(c, host="linux-box", build="b1", h_ms=22.0)
    # drift: the previous run is the same host and build, not the newer Mac or other-build run
    comp = compare_with_previous(c, new)
    assert comp["previous_run_id"] == old["run_id"]
    assert compare_with_previous(c, mac) is None
    # latest: this host by default, every host on request; one per (recipe, host, build)
    assert {r.info.run_id for r in queries.latest_runs(c, "01_cost_fit")} == {
        old["run_id"], other_build["run_id"], new["run_id"]}
    assert len(queries.latest_runs(c, "01_cost_fit", host=None)) == 4
    per = queries.latest_per_recipe(c, "01_cost_fit")
    assert {r.info.run_id for r in per} == {mac["run_id"], other_build["run_id"], new["run_id"]}
    # compare: newest run per host/build side by side, ratio against the oldest machine
    table, runs = compare(c, recipe_name="default", notebook="01_cost_fit", by=["host", "build"])
    assert [r["run_id"] for r in runs] == [mac["run_id"], other_build["run_id"], new["run_id"]]
    row = table.set_index("measurement").loc["verify/H_ms"]  # the old key, read under its current name
    assert row["mac-mini · b9"] == 10.0 and row["linux-box · b1/mac-mini · b9"] == pytest.approx(2.2)
    table, runs = compare(c, recipe_name="default", notebook="01_cost_fit", by=["host"], baseline="linux-box")
    assert table.set_index("measurement").loc["verify/H_ms", "mac-mini/linux-box"] == pytest.approx(10.0 / 22.0)
    assert "| measurement | linux-box | mac-mini | mac-mini/linux-box |" in render(table, "md")
    assert r"\begin{tabular}{lrrr}" in render(table, "latex") and "verify/H\\_ms" in render(table, "latex")
    assert render(table, "csv").splitlines()[0] == "measurement,linux-box,mac-mini,mac-mini/linux-box"
    with pytest.raises(LabkitError, match="needs two or more"):
        compare(c, recipe_name="default", notebook="01_cost_fit", by=["commit"])


def test_experiment_prefix_keeps_two_projects_apart(store, monkeypatch):
    monkeypatch.setenv("LABKIT_EXPERIMENT_PREFIX", "proj-a/")
    c = tracking.client()
    run = _fake_run(c, host=fingerprint.host_label()[0], build="b1", h_ms=1.0)
    assert c.get_experiment_by_name("proj-a/01_cost_fit") is not None
    assert c.get_run(run["run_id"]).data.tags["lab.experiment_prefix"] == "proj-a/"
    assert [r.info.run_id for r in queries.latest_runs(c, "01_cost_fit")] == [run["run_id"]]
    monkeypatch.setenv("LABKIT_EXPERIMENT_PREFIX", "proj-b/")
    assert queries.latest_runs(c, "01_cost_fit") == []
    assert tracking.find_run(c, run["id"][4:], missing_ok=True) is None


def test_a_database_uri_never_pins_artifacts_to_this_checkout(monkeypatch):
    monkeypatch.setenv("MLFLOW_TRACKING_URI", "postgresql+psycopg2://labkit:secret@db.example/mlflow")
    with pytest.raises(LabkitError, match="is a database") as e:
        tracking.artifact_root()
    assert "secret" not in str(e.value) and "LABKIT_ARTIFACT_ROOT" in e.value.fix
    monkeypatch.setenv("LABKIT_ARTIFACT_ROOT", "s3://team-bucket/labkit/")
    assert tracking.artifact_root() == "s3://team-bucket/labkit"
    monkeypatch.setenv("MLFLOW_TRACKING_URI", "http://127.0.0.1:5005")
    monkeypatch.delenv("LABKIT_ARTIFACT_ROOT")
    assert tracking.artifact_root() is None  # the server's proxied mlflow-artifacts:


def test_short_retries_apply_to_the_probe_only(monkeypatch):
    port = _free_port()  # nothing listens there
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"http://127.0.0.1:{port}")
    t0 = time.monotonic()
    with pytest.raises(LabkitError, match="does not answer"):
        tracking.client()
    assert time.monotonic() - t0 < 60
    for var in ("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "MLFLOW_HTTP_REQUEST_TIMEOUT"):
        assert var not in os.environ  # a long run keeps MLflow's own retries
    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "7")
    tracking.client(check=False)
    assert os.environ["MLFLOW_HTTP_REQUEST_MAX_RETRIES"] == "7"


# -- a real mlflow server that goes away mid-notebook --------------------------------------------
class MlflowServer:
    """`mlflow server` on a SQLite backend on 127.0.0.1, in its own process group."""

    def __init__(self, d: Path, port: int):
        self.d, self.port, self.proc = d, port, None
        self.url = f"http://127.0.0.1:{port}"

    def start(self, wait: int = 180) -> None:
        log = open(self.d / "server.log", "a")
        mlflow = Path(sys.executable).with_name("mlflow")
        self.proc = subprocess.Popen(
            [str(mlflow), "server", "--backend-store-uri", f"sqlite:///{self.d / 'server.db'}", "--serve-artifacts",
             "--artifacts-destination", str(self.d / "artifacts"), "--host", "127.0.0.1", "--port", str(self.port),
             "--workers", "1"],
            stdout=log, stderr=log, start_new_session=True,
            env={**os.environ, "MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false"})
        t0 = time.monotonic()
        while not _healthy(self.url):
            assert self.proc.poll() is None, (self.d / "server.log").read_text()[-3000:]
            assert time.monotonic() - t0 < wait, "mlflow server did not answer /health"
            time.sleep(0.25)

    def stop(self) -> None:
        if self.proc is None or self.proc.poll() is not None:
            return
        try:
            os.killpg(self.proc.pid, signal.SIGTERM)
            self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(timeout=30)
        except ProcessLookupError:
            pass


@pytest.mark.slow
def test_server_down_mid_notebook_then_sync_replays_the_journal(tmp_path):
    server = MlflowServer(tmp_path, _free_port())
    # the kernel's calls fail fast while the server is away (MLflow's default retries take minutes)
    env = _env(ROOT, server.url, MLFLOW_HTTP_REQUEST_MAX_RETRIES="0", MLFLOW_HTTP_REQUEST_TIMEOUT="5")
    out = tmp_path / "out"
    journal = out / "01_cost_fit.cells.jsonl"
    try:
        server.start()
        proc = subprocess.Popen([sys.executable, "-m", "labkit.cli", "reproduce", "--only", "01_cost_fit", *TINY,
                                 "--json", "--out", str(out)], env=env, cwd=ROOT, stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True)
        try:
            t0 = time.monotonic()
            # the start cell (c3) is logged: stop the server while the measuring cells run
            while not (journal.exists() and '"index": 3' in journal.read_text()):
                assert proc.poll() is None, proc.communicate()[1][-3000:]
                assert time.monotonic() - t0 < 600, "the notebook never reached its start cell"
                time.sleep(0.2)
            server.stop()
            stdout, stderr = proc.communicate(timeout=900)
        finally:
            if proc.poll() is None:
                proc.kill()
        assert stdout.strip(), stderr[-4000:]
        summary = json.loads(stdout.strip().splitlines()[-1])
        res = summary["results"][0]
        # the notebook finished; the store missed the rest; reproduce says so and exits 1
        assert proc.returncode == 1 and res["status"] == "FINISHED" and res.get("sync") == "pending", stderr[-3000:]
        # the parent run's close could not be written either: it is journaled beside the notebook's
        assert summary["pending_sync"] == [str(journal), str(out / "reproduce.parent.jsonl")] and "labkit sync" in stderr
        recs = [json.loads(x) for x in journal.read_text().splitlines()]
        assert any(r["type"] == "mlflow_error" for r in recs) and recs[-1]["type"] == "close"
        n_cells = _code_cells(res["executed"])
        assert max(r["index"] for r in recs if r["type"] == "cell") == n_cells

        server.start()  # same database, same artifacts, same port: the server is back
        c = tracking_client(server.url)
        before = c.get_run(res["run_id"])
        assert before.info.status == "RUNNING" and "verify/H_ms" not in before.data.metrics
        r = _cli(["sync", str(out), "--json"], env=env, cwd=ROOT, timeout=300)
        assert r.returncode == 0, r.stderr[-3000:]
        assert _last_json(r)["written"] > 0
        run = c.get_run(res["run_id"])
        assert run.info.status == "FINISHED" and run.data.tags["lab.status"] == "FINISHED"
        parent = c.get_run(run.data.tags["mlflow.parentRunId"])
        assert parent.info.status == "FINISHED" and res["id"] in parent.data.tags["mlflow.note.content"]
        assert len(c.list_artifacts(res["run_id"], "cells")) == n_cells
        assert run.data.tags["lab.cells"] == str(n_cells) and run.data.tags.get("engine.build")
        # tags set while the store was away (01's llama-bench cross-check) come back from the journal
        assert run.data.tags.get("crosscheck.verdict") in ("agree", "disagree", "undetermined")
        assert {"verify/H_ms", "verify/H_ms.lo", "verify/a_ms", "verify/b_ms", "verify/r2", "lab/seconds"} <= set(run.data.metrics)
        assert run.data.params["kv_depth"] == "32"
        names = {a.path for a in c.list_artifacts(res["run_id"], "figures")}
        assert {"figures/cost-fit", "figures/cost-fit-m2-parity"} <= names
        # idempotent: a second sync (every journal re-checked) writes nothing
        r = _cli(["sync", "--recheck", str(out), "--json"], env=env, cwd=ROOT, timeout=300)
        assert r.returncode == 0 and _last_json(r)["written"] == 0, r.stderr[-3000:]
        assert len(c.get_metric_history(res["run_id"], "verify/H_ms")) == 1
        assert len(c.get_metric_history(res["run_id"], "lab/cell_duration_s")) == n_cells - 2
        # and what was replayed reads back like any run's
        r = _cli(["regen", f"{res['id']}/cost-fit", "--out", str(tmp_path / "regen"), "--json"], env=env, cwd=ROOT, timeout=300)
        assert r.returncode == 0 and _last_json(r)["identical"], r.stderr[-3000:]
    finally:
        server.stop()


def tracking_client(uri: str):
    from mlflow.tracking import MlflowClient

    return MlflowClient(tracking_uri=uri)


# -- the team server: PostgreSQL, two clones, two hosts at once -----------------------------------
def _postgres_missing() -> str | None:
    if not glob.glob("/usr/lib/postgresql/*/bin/initdb") and shutil.which("initdb") is None:
        return "PostgreSQL is not installed: apt-get install -y postgresql (or scripts/system-deps.sh)"
    try:
        import psycopg2  # noqa: F401
    except ImportError:
        return "psycopg2 is missing: pip install 'labkit[postgres]' (psycopg2-binary)"
    if os.geteuid() == 0 and subprocess.run(["id", "postgres"], capture_output=True).returncode != 0:
        return "running as root without a 'postgres' user: apt-get install -y postgresql creates it"
    return None


def team_data_dir(prefix: str) -> Path:
    """A fresh LABKIT_TEAM_DIR for a test's server (the test skips where PostgreSQL is missing)."""
    why = _postgres_missing()
    if why:
        pytest.skip(why)
    d = Path(tempfile.mkdtemp(prefix=prefix, dir="/tmp"))  # short: the socket path is bounded
    d.chmod(0o755)  # the postgres user walks into it
    return d


def team_script_env(d: Path, port: int, **extra) -> dict:
    """scripts/team-server.sh's environment for a test's server in ``d`` on ``port``."""
    return {**os.environ, "LABKIT_TEAM_DIR": str(d), "LABKIT_TEAM_PORT": str(port), "LABKIT_TEAM_WAIT": "240",
            "LABKIT_MLFLOW": str(Path(sys.executable).with_name("mlflow")), "LABKIT_TEAM_WORKERS": "2", **extra}


@pytest.fixture(scope="module")
def team_server():
    d = team_data_dir("lkteam.")
    port = _free_port()
    env = team_script_env(d, port)
    script = ROOT / "scripts" / "team-server.sh"
    try:
        r = subprocess.run([str(script), "start"], env=env, capture_output=True, text=True, timeout=300)
        assert r.returncode == 0, r.stderr[-3000:]
        url = r.stdout.strip().splitlines()[-1]
        assert url == f"http://127.0.0.1:{port}" and _healthy(url)
        yield url
    finally:
        subprocess.run([str(script), "stop"], env=env, capture_output=True, text=True, timeout=180)
        shutil.rmtree(d, ignore_errors=True)


@pytest.mark.slow
def test_two_clones_two_hosts_one_team_server(team_server, tmp_path):
    # the two clones measure at once on one box: one thread each, so that neither engine's threads
    # wait on the other's (two 2-thread engines on 2 cores take several times as long)
    recipe = tiny.recipe_file(tmp_path / "default-1-thread.yaml", threads=1)
    clones = {}
    for label in ("host-a", "host-b"):
        dst = tmp_path / label
        subprocess.run(["git", "clone", "-q", str(ROOT), str(dst)], check=True, timeout=120)
        clones[label] = dst
    procs = {label: subprocess.Popen(
        [sys.executable, "-m", "labkit.cli", "reproduce", "--recipe", recipe, "--only", "01_cost_fit", *TINY,
         "--json"],
        env=_env(root, team_server, LABKIT_HOST_LABEL=label), cwd=root, stdout=subprocess.PIPE,
        stderr=subprocess.PIPE, text=True) for label, root in clones.items()}
    outs = {}
    try:
        for label, p in procs.items():
            outs[label] = p.communicate(timeout=1200)
    finally:
        for p in procs.values():
            if p.poll() is None:
                p.kill()
    res = {}
    for label, p in procs.items():
        assert p.returncode == 0, outs[label][1][-3000:]
        summary = json.loads(outs[label][0].strip().splitlines()[-1])
        assert summary["ok"] and summary["tracking_uri"] == team_server
        res[label] = summary["results"][0]
    assert res["host-a"]["id"] != res["host-b"]["id"] and res["host-a"]["run_id"] != res["host-b"]["run_id"]
    c = tracking_client(team_server)
    assert c.get_experiment_by_name("01_cost_fit").artifact_location.startswith("mlflow-artifacts:")
    for label, r in res.items():
        run = c.get_run(r["run_id"])
        assert run.info.status == "FINISHED" and run.data.tags["host.label"] == label
        assert run.data.tags["host.accelerator"] and run.data.tags.get("engine.build")
        n_cells = _code_cells(r["executed"])
        assert len(c.list_artifacts(r["run_id"], "cells")) == n_cells == int(run.data.tags["lab.cells"])
        assert "verify/H_ms" in run.data.metrics
    # each clone reads the other's run: show and regen, artifacts through the server
    for here, there in (("host-b", "host-a"), ("host-a", "host-b")):
        env = _env(clones[here], team_server, LABKIT_HOST_LABEL=here)
        fig = f"{res[there]['id']}/cost-fit"
        r = _cli(["show", fig, "--json"], env=env, cwd=clones[here], timeout=300)
        assert r.returncode == 0 and _last_json(r)["provenance"]["host.label"] == there, r.stderr[-3000:]
        r = _cli(["regen", fig, "--out", str(tmp_path / f"regen-{here}"), "--json"], env=env, cwd=clones[here], timeout=300)
        assert r.returncode == 0 and _last_json(r)["identical"], r.stderr[-3000:]
    compare = ["compare", "--recipe", recipe, "--notebook", "01_cost_fit", "--by", "host"]
    r = _cli(compare + ["--json"], env=_env(clones["host-a"], team_server), cwd=clones["host-a"], timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    out = _last_json(r)
    assert sorted(x["label"] for x in out["runs"]) == ["host-a", "host-b"]
    assert {x["run_id"] for x in out["runs"]} == {res["host-a"]["run_id"], res["host-b"]["run_id"]}
    a, b = (x["label"] for x in out["runs"])
    h = next(row for row in out["rows"] if row["measurement"] == "verify/H_ms")
    assert h[f"{b}/{a}"] == pytest.approx(h[b] / h[a])
    r = _cli(compare, env=_env(clones["host-a"], team_server), cwd=clones["host-a"], timeout=300)
    assert r.returncode == 0 and f"| measurement | {a} | {b} | {b}/{a} |" in r.stdout, r.stderr[-3000:]
