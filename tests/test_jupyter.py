"""JupyterLab as a user meets it: a real ``jupyter lab`` server with the project's config,
notebook kernels started through its session API exactly as JupyterLab starts them
(``POST /api/sessions`` with the notebook's path and the ``labkit`` kernel), cells sent
with their nbformat ids as JupyterLab sends them, kernels shut down through the API.

What must hold: each run is named after its notebook, closes FINISHED when the last cell
has run (so 03 finds the interactive 02), FAILED when a cell raised and was not re-run,
closes on kernel shutdown, and a second ``start()`` says what it did; saving through the
contents API writes no outputs, and the jupytext pair stays as committed.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
import urllib.error
import urllib.request
import uuid
from pathlib import Path

import nbformat
import pytest

import servers  # tests/servers.py
from labkit.provenance import tracking

pytestmark = pytest.mark.slow  # a real `jupyter lab` server, kernels, notebooks 02 and 03

ROOT = Path(__file__).resolve().parents[1]
SRC = ROOT / "src"
CONFIG = ROOT / "jupyter-config" / "jupyter_server_config.py"
TOKEN = uuid.uuid4().hex
STARTUP_S = 300  # a cold `jupyter lab` on a busy 2-core box (load 20 seen)
CELL_S = 900  # the tiny sweep cell, contended

TINY_02 = ('recipe = "default"\nk = [0, 2]\nworkloads = ["edit"]\ndrafters = ["ngram"]\nruns = 1\n'
           'max_tokens = 16\nprompts_per_workload = 1\ntemperatures = [0.0]\ngate = None\n')


class Server:
    """A running `jupyter lab` (as `make lab` runs it) and the REST calls JupyterLab makes."""

    def __init__(self, root: Path, runtime: Path, port: int, proc: subprocess.Popen):
        self.root, self.runtime, self.port, self.proc = root, runtime, port, proc

    def api(self, method: str, path: str, body: dict | None = None, timeout: float = 60):
        req = urllib.request.Request(
            f"http://127.0.0.1:{self.port}{path}", method=method,
            data=None if body is None else json.dumps(body).encode(),
            headers={"Authorization": f"token {TOKEN}", "Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(req, timeout=timeout) as r:
                text = r.read().decode()
                return json.loads(text) if text else None
        except urllib.error.HTTPError as e:
            log = (self.root.parent / "server.log").read_text()[-4000:]
            raise AssertionError(f"{method} {path}: HTTP {e.code} {e.read().decode()[:2000]}\n{log}") from None

    def open_notebook(self, name: str) -> dict:
        """What JupyterLab does when a notebook is opened: a session for its path."""
        return self.api("POST", "/api/sessions", {"path": name, "name": name, "type": "notebook",
                                                  "kernel": {"name": "labkit"}})

    def client(self, session: dict):
        from jupyter_client import BlockingKernelClient

        kid, deadline = session["kernel"]["id"], time.monotonic() + STARTUP_S
        while True:
            kc = BlockingKernelClient(connection_file=str(self.runtime / f"kernel-{kid}.json"))
            kc.load_connection_file()
            kc.start_channels()
            try:
                kc.wait_for_ready(timeout=max(1.0, deadline - time.monotonic()))
                return kc
            except RuntimeError:  # "died before replying": a busy box missed the first heartbeats
                kc.stop_channels()
                alive = kid in {k["id"] for k in self.api("GET", "/api/kernels")}
                if not alive or time.monotonic() > deadline:
                    raise
                time.sleep(1)

    def shutdown(self, session: dict, timeout: float = 60) -> None:
        """Close the notebook's kernel as JupyterLab does (DELETE the session), and wait
        until the kernel process has gone."""
        self.api("DELETE", f"/api/sessions/{session['id']}")
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if session["kernel"]["id"] not in {k["id"] for k in self.api("GET", "/api/kernels")}:
                return
            time.sleep(0.2)
        raise AssertionError(f"kernel {session['kernel']['id']} still running after {timeout} s")


@pytest.fixture(scope="module")
def server(store, tmp_path_factory):
    """`jupyter lab` on 127.0.0.1 with the project config, serving a copy of notebooks/
    (saves in the tests must not touch the checkout); always stopped."""
    base = tmp_path_factory.mktemp("jupyter")
    root = base / "notebooks"
    shutil.copytree(ROOT / "notebooks", root, ignore=shutil.ignore_patterns(".ipynb_checkpoints"))
    runtime, kernels = base / "runtime", base / "kernels"
    # the kernelspec exactly as scripts/setup.sh installs it, into a prefix of the test's own
    subprocess.run([sys.executable, "-m", "ipykernel", "install", "--prefix", str(kernels), "--name", "labkit",
                    "--display-name", "labkit (.venv)"], check=True, capture_output=True, timeout=120)
    env = {**os.environ, "JUPYTER_RUNTIME_DIR": str(runtime), "JUPYTER_CONFIG_DIR": str(base / "config"),
           "JUPYTER_PATH": str(kernels / "share" / "jupyter"), "PYTHONPATH": str(SRC),
           "LABKIT_JOURNAL": str(base / "journal.jsonl")}
    port = servers.free_port()
    cmd = [sys.executable, "-m", "jupyterlab", "--no-browser", "--ServerApp.ip=127.0.0.1",
           f"--ServerApp.port={port}", "--ServerApp.port_retries=0", f"--IdentityProvider.token={TOKEN}",
           f"--ServerApp.root_dir={root}", f"--config={CONFIG}"]
    if os.geteuid() == 0:
        cmd.append("--allow-root")
    log = open(base / "server.log", "w")
    proc = subprocess.Popen(cmd, env=env, stdout=log, stderr=subprocess.STDOUT, cwd=root)
    srv = Server(root, runtime, port, proc)
    try:
        servers.wait_for_http(f"http://127.0.0.1:{port}/api/status?token={TOKEN}", proc, timeout=STARTUP_S,
                              what="jupyter lab", log=base / "server.log")
        yield srv
    finally:
        servers.stop(proc, timeout=60)  # the server shuts its kernels down on SIGTERM
        log.close()


def run_cell(kc, source: str, *, cell_id: str | None, timeout: float = CELL_S, silent: bool = False,
             expressions: dict | None = None) -> tuple[dict, list]:
    """Execute one cell as JupyterLab does (``cellId`` in the request's metadata); return
    the reply content and the cell's outputs as nbformat output nodes."""
    msg = kc.session.msg("execute_request", {"code": source, "silent": silent, "store_history": not silent,
                                             "user_expressions": expressions or {}, "allow_stdin": False,
                                             "stop_on_error": True},
                         metadata={"cellId": cell_id} if cell_id else {})
    kc.shell_channel.send(msg)
    msg_id = msg["header"]["msg_id"]
    outputs, deadline = [], time.monotonic() + timeout
    while True:
        m = kc.get_iopub_msg(timeout=max(1.0, deadline - time.monotonic()))
        if m["parent_header"].get("msg_id") != msg_id:
            continue
        kind = m["header"]["msg_type"]
        if kind == "status" and m["content"]["execution_state"] == "idle":
            break
        if kind in ("stream", "display_data", "execute_result", "error"):
            outputs.append(nbformat.v4.output_from_msg(m))
    while True:
        reply = kc.get_shell_msg(timeout=max(1.0, deadline - time.monotonic()))
        if reply["parent_header"].get("msg_id") == msg_id:
            return reply["content"], outputs


def run_notebook(server: Server, name: str, *, params: str | None = None, stop_before_last: bool = False):
    """Open a notebook and run its code cells top to bottom (the parameters cell replaced by
    ``params``); returns (session, client, notebook with the outputs, run_id)."""
    nb = nbformat.read(server.root / name, as_version=4)
    session = server.open_notebook(name)
    kc = server.client(session)
    code = [c for c in nb.cells if c.cell_type == "code"]
    for cell in code[:-1] if stop_before_last else code:
        if params is not None and "parameters" in cell.metadata.get("tags", []):
            cell.source = params
        reply, outputs = run_cell(kc, cell.source, cell_id=cell.id)
        assert reply["status"] == "ok", (name, cell.source[:200], reply.get("evalue"), reply.get("traceback"))
        cell.outputs = outputs
        cell.execution_count = reply["execution_count"]
    return session, kc, nb, peek(kc, "lab.run_id")


def peek(kc, expression: str):
    """A value from the kernel without running a cell (a silent request with a user
    expression, as inspectors do: no cell hooks fire, so the run is not touched)."""
    import ast

    reply, _ = run_cell(kc, "", cell_id=None, timeout=60, silent=True, expressions={"v": expression})
    return ast.literal_eval(reply["user_expressions"]["v"]["data"]["text/plain"])


def logged_cells(c, run_id: str) -> list[dict]:
    paths = sorted(a.path for a in c.list_artifacts(run_id, "cells"))
    return [tracking.load_json_artifact(c, run_id, p) for p in paths]


@pytest.fixture(scope="module")
def sweep_then_positions(server):
    """02 (tiny parameters) then 03, interactively, each kernel shut down through the API."""
    s2, kc2, nb2, run2 = run_notebook(server, "02_k_sweep.ipynb", params=TINY_02)
    status_after_last_cell = tracking.client().get_run(run2).info.status
    s3, kc3, nb3, run3 = run_notebook(server, "03_acceptance_by_position.ipynb")
    for kc, s in ((kc2, s2), (kc3, s3)):
        kc.stop_channels()
        server.shutdown(s)
    return {"02": (nb2, run2, status_after_last_cell), "03": (nb3, run3)}


def test_02_then_03_finish_under_their_notebook_names(sweep_then_positions):
    c = tracking.client()
    nb2, run2, status_after_last_cell = sweep_then_positions["02"]
    nb3, run3 = sweep_then_positions["03"]
    assert status_after_last_cell == "FINISHED"  # closed by its last cell, before 03 looked for it
    for nb, rid, name in ((nb2, run2, "02_k_sweep"), (nb3, run3, "03_acceptance_by_position")):
        run = c.get_run(rid)
        assert run.info.status == "FINISHED", (name, run.data.tags.get("lab.closed_by"))
        assert c.get_experiment(run.info.experiment_id).name == name
        assert run.data.tags["lab.notebook"] == name and run.data.tags["lab.mode"] == "interactive"
        lab_id = run.data.tags["lab.id"]
        assert lab_id.startswith(f"LAB:{name[:2]}-") and run.info.run_name.endswith(lab_id)
        assert run.data.tags["mlflow.source.name"].endswith(f"{name}.ipynb")
        # every code cell of the notebook was logged, with the id JupyterLab sent, and ran OK
        by_id = {r["cell_id"]: r for r in logged_cells(c, rid) if r["cell_id"]}
        for cell in (x for x in nb.cells if x.cell_type == "code"):
            if "parameters" in cell.metadata.get("tags", []):  # ran before start(): logged from history
                assert cell.source.strip() in [r["source"].strip() for r in logged_cells(c, rid)]
                continue
            assert by_id[cell.id]["source"].strip() == cell.source.strip() and by_id[cell.id]["status"] == "ok"
    # 03 read the interactive 02 (its tiny sweep), and says so
    assert c.get_run(run3).data.tags["lab.source"] == c.get_run(run2).data.tags["lab.id"]
    p = c.get_run(run2).data.params
    assert p["k"] == "[0, 2]" and p["recipe"] == "default" and p["gate"] == "0.6"  # None -> the recipe's value
    assert p["workloads"] == '["edit"]' and p["recipe.model"] == "gemma-3-270m-q4_k_m"  # strings unquoted


def test_sweep_logs_sortable_best_k_and_grouped_keys(sweep_then_positions):
    c = tracking.client()
    _, run2, _ = sweep_then_positions["02"]
    m = c.get_run(run2).data.metrics
    assert m["best/k/ngram.edit"] in (0, 2)
    assert m["best/speedup/ngram.edit"] >= 1.0 if m["best/k/ngram.edit"] else m["best/speedup/ngram.edit"] == 1.0
    hist = {x.step: x.value for x in c.get_metric_history(run2, "speedup/ngram.edit.T0")}
    assert set(hist) == {2}  # one point per k the drafter ran (k = 0 is the plain arm, drafter "none")
    if m["best/k/ngram.edit"] == 2:
        assert m["best/speedup/ngram.edit"] == pytest.approx(hist[2])
    # tables are also MLflow tables (what the UI's table view and mlflow.load_table read)
    t = c.load_table(c.get_run(run2).info.experiment_id, "tables/sweep-cells/table.json", run_ids=[run2])
    assert set(t["k"]) == {0, 2} and "speedup" in t


def test_save_strips_outputs_and_keeps_the_pair(server):
    """Save 03 through the contents API as JupyterLab's autosave does, its cells carrying
    outputs a real kernel produced (text, a rich display, an error) and the kernel's
    language_info: the .ipynb on disk has no outputs and the pair is byte-identical to
    what is committed."""
    session = server.open_notebook("99_outputs.ipynb")  # a kernel only to produce real outputs
    kc = server.client(session)
    try:
        _, outputs = run_cell(kc, "from IPython.display import Markdown, display\nprint('text')\n"
                                  "display(Markdown('**rich**'))\n1 / 0", cell_id=None, timeout=120)
    finally:
        kc.stop_channels()
        server.shutdown(session)
    assert {o["output_type"] for o in outputs} == {"stream", "display_data", "error"}
    name = "03_acceptance_by_position"
    path = server.root / f"{name}.ipynb"
    nb = nbformat.read(path, as_version=4)
    for i, cell in enumerate(c for c in nb.cells if c.cell_type == "code"):
        cell.outputs, cell.execution_count = outputs, i + 1
    content = json.loads(json.dumps(nb))  # sources as strings, as JupyterLab sends them
    content["metadata"]["language_info"] = {"name": "python", "version": sys.version.split()[0]}
    server.api("PUT", f"/api/contents/{path.name}", {"type": "notebook", "format": "json", "content": content})
    saved = json.loads(path.read_text())
    assert all(cell.get("outputs") == [] and cell.get("execution_count") is None
               for cell in saved["cells"] if cell["cell_type"] == "code")
    # nothing a reproduction reads has changed: both files of the pair are as committed
    assert path.read_bytes() == (ROOT / "notebooks" / f"{name}.ipynb").read_bytes()
    assert (server.root / f"{name}.py").read_bytes() == (ROOT / "notebooks" / f"{name}.py").read_bytes()


SCRATCH = [  # SYNTHETIC: a notebook that needs no model, for the lifecycle rules
    ('recipe = "default"\nmax_tokens = 16', ["parameters"]),
    ("from labkit import lab as labkit_lab\nlab = labkit_lab.start(globals())", []),
    ("lab.metric('answer', 42.0)", []),
    ("print('last cell')", []),
]


def _scratch(server: Server, name: str) -> list:
    nb = nbformat.v4.new_notebook()
    nb.metadata["kernelspec"] = {"name": "labkit", "display_name": "labkit (.venv)", "language": "python"}
    nb.cells = [nbformat.v4.new_code_cell(src, metadata={"tags": tags}) for src, tags in SCRATCH]
    nbformat.write(nb, server.root / name)
    return nb.cells


def _run_id(kc) -> str:
    return peek(kc, "lab.run_id")


def test_failed_cell_then_kernel_shutdown_closes_failed(server):
    cells = _scratch(server, "97_scratch.ipynb")
    session = server.open_notebook("97_scratch.ipynb")
    kc = server.client(session)
    try:
        for cell in cells[:3]:
            run_cell(kc, cell.source, cell_id=cell.id, timeout=120)
        reply, _ = run_cell(kc, "1 / 0", cell_id=cells[2].id, timeout=60)  # the metric cell, edited to fail
        assert reply["status"] == "error"
        rid = _run_id(kc)
    finally:
        kc.stop_channels()
        server.shutdown(session)
    run = tracking.client().get_run(rid)
    assert run.info.status == "FAILED" and run.data.tags["lab.closed_by"] == "the kernel shut down"
    assert run.data.tags["lab.notebook"] == "97_scratch"


def test_rerun_after_finish_continues_and_second_start_begins_a_new_run(server):
    cells = _scratch(server, "98_scratch.ipynb")
    session = server.open_notebook("98_scratch.ipynb")
    kc = server.client(session)
    c = tracking.client()
    try:
        for cell in cells:
            run_cell(kc, cell.source, cell_id=cell.id, timeout=120)
        first = _run_id(kc)
        assert c.get_run(first).info.status == "FINISHED"
        _, out = run_cell(kc, cells[2].source, cell_id=cells[2].id, timeout=60)  # a cell after the end
        assert "continues (was FINISHED)" in "".join(o.get("text", "") for o in out)
        assert c.get_run(first).info.status == "RUNNING"
        _, out = run_cell(kc, cells[1].source, cell_id=cells[1].id, timeout=120)  # start() again
        text = json.dumps([o.get("data", {}).get("text/markdown", "") for o in out])
        assert f"previous run `[{c.get_run(first).data.tags['lab.id']}]` closed FINISHED" in text
        second = _run_id(kc)
        assert second != first and c.get_run(first).info.status == "FINISHED"
        assert c.get_run(second).info.status == "RUNNING"
    finally:
        kc.stop_channels()
        server.shutdown(session)
    run = c.get_run(second)
    assert run.info.status == "FINISHED" and run.data.tags["lab.closed_by"] == "the kernel shut down"
