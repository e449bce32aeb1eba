"""JupyterLab as a user meets it: a real ``jupyter lab`` server with the project's config,
serving the notebooks of a git clone of this repository (with the nbstripout filter that
scripts/setup.sh configures), driven two ways:

- in headless Chromium through JupyterLab's own menus: 02 with its parameters cell edited
  to a tiny sweep, Run All, Save; then 03, Run All, Save; then 02 closed and reopened;
- through the REST and kernel APIs exactly as JupyterLab uses them (``POST /api/sessions``,
  cells sent with their nbformat ids), for the run lifecycle rules.

What must hold: each run is named after its notebook and closes FINISHED when its last
cell has run, FAILED when a cell raised and was not re-run, and on kernel shutdown; a
second ``start()`` says what it did. 03's first output line names the 02 of the same
JupyterLab session. A saved notebook keeps its outputs (the figures are there when it is
reopened) while git sees no change to a notebook whose only change is outputs; the
edited parameters are a change git shows, and ``labkit reproduce`` refuses naming it.
Cells show no stderr box; the kernel logs no TCP warning; no news popup.

Set ``UI_SCREENSHOTS=/some/dir`` to keep screenshots of the notebook pages.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import urllib.error
import urllib.request
import uuid
from pathlib import Path

import nbformat
import pytest

import browser  # tests/browser.py
import servers  # tests/servers.py
from labkit.errors import LabkitError
from labkit.lab import gitfilter
from labkit.provenance import tracking

pytestmark = pytest.mark.slow  # a real `jupyter lab` server, kernels, notebooks 02 and 03

ROOT = Path(__file__).resolve().parents[1]
SRC = ROOT / "src"
CONFIG = ROOT / "jupyter-config" / "jupyter_server_config.py"
TOKEN = uuid.uuid4().hex
STARTUP_S = 300  # a cold `jupyter lab` on a busy 2-core box (load 20 seen)
CELL_S = 900  # the tiny sweep cell, contended
PAGE_S = 120  # a notebook page rendering its outputs

# typed into 02's parameters cell in the browser: the smallest sweep that has a k > 0 arm
TINY_02 = ['recipe = "default"', "k = [0, 1]", 'workloads = ["edit"]', 'drafters = ["ngram"]', "runs = 1",
           "max_tokens = 16", "prompts_per_workload = 1", "temperatures = [0.0]", "gate = None",
           'protocol = "full"']


class Server:
    """A running `jupyter lab` (as `make lab` runs it) and the REST calls JupyterLab makes."""

    def __init__(self, root: Path, runtime: Path, port: int, proc: subprocess.Popen):
        self.root, self.runtime, self.port, self.proc = root, runtime, port, proc
        self.repo, self.log = root.parent, runtime.parent / "server.log"

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
            log = self.log.read_text()[-4000:]
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
    """`jupyter lab` on 127.0.0.1 with the project config, serving the notebooks of a git
    clone of this repository with the nbstripout filter configured (saves in the tests must
    not touch the checkout, and git must judge them as it does here); always stopped."""
    base = tmp_path_factory.mktemp("jupyter")
    repo = base / "repo"
    subprocess.run(["git", "clone", "-q", "--no-hardlinks", str(ROOT), str(repo)], check=True, timeout=300)
    gitfilter.install(repo, python=sys.executable)
    root = repo / "notebooks"
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


def _shot(driver, name: str) -> None:
    where = os.environ.get("UI_SCREENSHOTS")
    if where:
        Path(where).mkdir(parents=True, exist_ok=True)
        browser.screenshot(driver, Path(where) / f"{name}.png")


def _newest_interactive(c, notebook: str, after_ms: int):
    exp = tracking.get_experiment(c, notebook)
    if exp is None:
        return None
    runs = c.search_runs([exp.experiment_id], filter_string="tags.`lab.mode` = 'interactive'",
                         order_by=["attributes.start_time DESC"], max_results=1)
    return runs[0] if runs and runs[0].info.start_time >= after_ms else None


def _run_all_and_save(server: Server, page, notebook: str, *, timeout: float = CELL_S) -> str:
    """Run > Run All Cells, wait until the notebook's run has closed and its kernel is idle,
    then File > Save Notebook and wait for the outputs on disk; the run's id."""
    c, t0 = tracking.client(), int(time.time() * 1000) - 1000
    browser.jupyterlab_menu(page, "Run", "Run All Cells")
    deadline, idle_since = time.monotonic() + timeout, None
    while True:
        run = _newest_interactive(c, notebook, t0)
        idle = all(k["execution_state"] == "idle" for k in server.api("GET", "/api/kernels"))
        if run is not None and run.info.status != "RUNNING" and idle:
            break
        cells = [r for r in _journal(server) if r.get("type") == "cell"]
        failed = cells[-1] if cells and cells[-1]["status"] == "error" else None
        idle_since = (idle_since or time.monotonic()) if failed else None
        if idle_since is not None and time.monotonic() - idle_since > 60:  # Run All stopped at the error
            raise AssertionError(f"{notebook}: Run All stopped at cell {failed['index']}: {failed['error']}")
        assert time.monotonic() < deadline, f"{notebook}: Run All did not finish in {timeout} s"
        time.sleep(0.5)
    path = server.root / f"{notebook}.ipynb"
    before = path.stat().st_mtime_ns
    browser.jupyterlab_menu(page, "File", "Save Notebook")
    deadline = time.monotonic() + 120
    while path.stat().st_mtime_ns == before or not _outputs(nbformat.read(path, as_version=4)):
        assert time.monotonic() < deadline, f"{notebook}: File > Save Notebook wrote no outputs"
        time.sleep(0.5)
    return run.info.run_id


def _journal(server: Server) -> list[dict]:
    path = server.runtime.parent / "journal.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def _outputs(nb) -> list:
    return [o for c in nb.cells if c.cell_type == "code" for o in c.outputs]


def _stderr(nb) -> list[str]:
    """The text of every stderr stream in the notebook (a pink box in JupyterLab)."""
    return [o.get("text", "") for o in _outputs(nb) if o.get("output_type") == "stream" and o.get("name") == "stderr"]


@pytest.fixture(scope="module")
def lab_02_then_03(server):
    """In Chromium, through JupyterLab's menus: 02 with its parameters cell typed as TINY_02,
    Run All, Save; 03, Run All, Save; then 02 closed (File > Close and Shut Down Notebook)
    and reopened. Returns what a test needs to judge it."""
    if browser.missing():
        pytest.skip(browser.missing())
    url = f"http://127.0.0.1:{server.port}/lab/tree/{{}}?token={TOKEN}"
    with browser.chromium(page_load_timeout=STARTUP_S) as page:
        page.get(url.format("02_k_sweep.ipynb"))
        browser.wait_for_text(page, "02 · k sweep", timeout=STARTUP_S)
        news = "official Jupyter news" in page.find_element("tag name", "body").text
        browser.jupyterlab_replace_cell(page, 'recipe = "default"', TINY_02)
        run2 = _run_all_and_save(server, page, "02_k_sweep")
        status_after_last_cell = tracking.client().get_run(run2).info.status
        _shot(page, "jupyterlab-02_k_sweep")
        page.get(url.format("03_acceptance_by_position.ipynb"))
        browser.wait_for_text(page, "03 · Acceptance by position", timeout=STARTUP_S)
        run3 = _run_all_and_save(server, page, "03_acceptance_by_position")
        first_line = browser.jupyterlab_first_output(page)
        _shot(page, "jupyterlab-03_acceptance_by_position")
        page.get(url.format("02_k_sweep.ipynb"))
        browser.wait_for_text(page, "02 · k sweep", timeout=STARTUP_S)
        browser.jupyterlab_menu(page, "File", "Close and Shut Down Notebook")
        browser.jupyterlab_accept_dialog(page)
        deadline = time.monotonic() + 120
        while [x for x in server.api("GET", "/api/sessions") if x["path"].endswith("02_k_sweep.ipynb")]:
            assert time.monotonic() < deadline, "File > Close and Shut Down Notebook left 02's kernel running"
            time.sleep(0.5)
        page.get(url.format("02_k_sweep.ipynb"))
        browser.wait_for_text(page, "02 · k sweep", timeout=STARTUP_S)
        figures = browser.jupyterlab_output_images(page, at_least=2, timeout=PAGE_S)
        _shot(page, "jupyterlab-02_k_sweep-reopened")
    for s in server.api("GET", "/api/sessions"):
        server.shutdown(s)
    return {"run2": run2, "run3": run3, "status_after_last_cell": status_after_last_cell, "news": news,
            "first_line": first_line, "figures_after_reopen": figures,
            "nb2": nbformat.read(server.root / "02_k_sweep.ipynb", as_version=4),
            "nb3": nbformat.read(server.root / "03_acceptance_by_position.ipynb", as_version=4)}


def test_02_then_03_in_the_browser_finish_under_their_notebook_names(lab_02_then_03):
    c = tracking.client()
    r = lab_02_then_03
    assert r["status_after_last_cell"] == "FINISHED"  # closed by its last cell, before 03 looked for it
    for nb, rid, name in ((r["nb2"], r["run2"], "02_k_sweep"), (r["nb3"], r["run3"], "03_acceptance_by_position")):
        run = c.get_run(rid)
        assert run.info.status == "FINISHED", (name, run.data.tags.get("lab.closed_by"))
        assert c.get_experiment(run.info.experiment_id).name == name
        assert run.data.tags["lab.notebook"] == name and run.data.tags["lab.mode"] == "interactive"
        lab_id = run.data.tags["lab.id"]
        assert lab_id.startswith(f"LAB:{name[:2]}-") and run.info.run_name.endswith(lab_id)
        assert run.data.tags["mlflow.source.name"].endswith(f"{name}.ipynb")
        # every code cell of the saved notebook was logged, with the id JupyterLab sent, and ran OK
        logged = logged_cells(c, rid)
        by_id = {x["cell_id"]: x for x in logged if x["cell_id"]}
        for cell in (x for x in nb.cells if x.cell_type == "code"):
            if "parameters" in cell.metadata.get("tags", []):  # ran before start(): logged from history
                assert cell.source.strip() in [x["source"].strip() for x in logged]
                continue
            assert by_id[cell.id]["source"].strip() == cell.source.strip() and by_id[cell.id]["status"] == "ok"
    p = c.get_run(r["run2"]).data.params
    assert p["k"] == "[0, 1]" and p["recipe"] == "default" and p["gate"] == "0.6"  # None -> the recipe's value
    assert p["workloads"] == '["edit"]' and p["recipe.model"] == "gemma-3-270m-q4_k_m"  # strings unquoted


def test_03_reads_the_02_of_this_jupyterlab_session_and_says_so_first(lab_02_then_03):
    c = tracking.client()
    r = lab_02_then_03
    id2 = c.get_run(r["run2"]).data.tags["lab.id"]
    run3 = c.get_run(r["run3"])
    assert run3.data.tags["lab.source"] == id2 and run3.data.params["sweep"] == id2
    assert "this JupyterLab session" in run3.data.tags["lab.source_rule"]
    # the notebook's first output line, on the page and in the saved file
    assert r["first_line"].startswith(f"Reads 02_k_sweep run [{id2}]: the newest finished one of this JupyterLab "
                                      "session."), r["first_line"]
    assert 'set sweep = "LAB:…" in the parameters cell' in r["first_line"]
    first = _outputs(r["nb3"])[0]
    assert first["data"]["text/markdown"].startswith(f"Reads 02_k_sweep run `[{id2}]`")


def test_saved_notebooks_keep_their_figures_and_git_sees_only_the_edited_parameters(server, lab_02_then_03):
    r = lab_02_then_03
    assert r["figures_after_reopen"] >= 2  # tok/s vs k and the speedup heatmap, drawn again from the file
    assert sum(1 for o in _outputs(r["nb2"]) if "image/png" in o.get("data", {})) >= 2
    assert _outputs(r["nb3"])
    status = subprocess.run(["git", "-C", str(server.repo), "status", "--porcelain"], capture_output=True,
                            text=True, check=True, timeout=120).stdout
    # 03 was saved with its outputs and is no change; 02's parameters cell is, in the pair
    assert sorted(status.split()) == ["M", "M", "notebooks/02_k_sweep.ipynb", "notebooks/02_k_sweep.py"], status
    env = {**os.environ, "LABKIT_ROOT": str(server.repo)}
    env.pop("LABKIT_NOTEBOOKS", None)
    out = subprocess.run([sys.executable, "-c", "from labkit.provenance import reproduce as rp; "
                          "rp.reproduce(only=['02', '03'])"], env={**env, "PYTHONPATH": str(SRC)},
                         capture_output=True, text=True, timeout=300)
    assert out.returncode != 0 and "LabkitError" in out.stderr, out.stderr[-2000:]
    problem = next(line for line in out.stderr.splitlines() if "LabkitError:" in line)
    assert "notebooks/02_k_sweep.ipynb" in problem and "notebooks/02_k_sweep.py" in problem
    assert "03_acceptance" not in problem
    with pytest.raises(LabkitError):  # the same refusal, in process
        from labkit.provenance import committed

        committed.check([server.root / "02_k_sweep.ipynb", server.root / "03_acceptance_by_position.ipynb"])


def test_cells_show_no_stderr_box_and_no_popup(server, lab_02_then_03):
    r = lab_02_then_03
    assert not r["news"], "JupyterLab asked about Jupyter news"
    for name in ("nb2", "nb3"):
        assert _stderr(r[name]) == [], (name, _stderr(r[name])[:3])
    log = server.log.read_text()
    assert "without encryption" not in log and "IProgress not found" not in log


def test_sweep_logs_best_k_as_run_tags_not_one_point_charts(lab_02_then_03):
    c = tracking.client()
    run = c.get_run(lab_02_then_03["run2"])
    tags, metrics = run.data.tags, run.data.metrics
    assert not [k for k in metrics if k.startswith("best/")]  # no one-point charts
    assert tags["best/k/ngram.edit"] in ("0", "1")
    speedup = float(tags["best/speedup/ngram.edit"])
    assert speedup >= 1.0 if tags["best/k/ngram.edit"] == "1" else speedup == 1.0
    hist = {x.step: x.value for x in c.get_metric_history(run.info.run_id, "speedup/ngram.edit.T0")}
    assert set(hist) == {1}  # one point per k the drafter ran (k = 0 is the plain arm, drafter "none")
    if tags["best/k/ngram.edit"] == "1":
        assert speedup == pytest.approx(hist[1], rel=1e-5)
    # tables are also MLflow tables (what the UI's table view and mlflow.load_table read)
    t = c.load_table(run.info.experiment_id, "tables/sweep-cells/table.json", run_ids=[run.info.run_id])
    assert set(t["k"]) == {0, 1} and "speedup" in t


def test_save_keeps_outputs_and_git_sees_no_change(server):
    """Save 03 through the contents API as JupyterLab's autosave does, its cells carrying
    outputs a real kernel produced (text, a rich display, an error) and the kernel's
    language_info: the .ipynb on disk keeps them, and git sees no change (the post-save
    hook refreshed the index entry; the filter drops the outputs)."""
    session = server.open_notebook("99_outputs.ipynb")  # a kernel only to produce real outputs
    kc = server.client(session)
    try:
        _, outputs = run_cell(kc, "from IPython.display import Markdown, display\nprint('text')\n"
                                  "display(Markdown('**rich**'))\n1 / 0", cell_id=None, timeout=120)
    finally:
        kc.stop_channels()
        server.shutdown(session)
    assert {o["output_type"] for o in outputs} == {"stream", "display_data", "error"}
    path = server.root / "03_acceptance_by_position.ipynb"
    committed_text = subprocess.run(["git", "-C", str(server.repo), "show", f"HEAD:notebooks/{path.name}"],
                                    capture_output=True, text=True, check=True, timeout=60).stdout
    nb = nbformat.reads(committed_text, as_version=4)
    for i, cell in enumerate(c for c in nb.cells if c.cell_type == "code"):
        cell.outputs, cell.execution_count = outputs, i + 1
    content = json.loads(json.dumps(nb))  # sources as strings, as JupyterLab sends them
    content["metadata"]["language_info"] = {"name": "python", "version": sys.version.split()[0]}
    server.api("PUT", f"/api/contents/{path.name}", {"type": "notebook", "format": "json", "content": content})
    saved = json.loads(path.read_text())
    assert all(len(cell.get("outputs")) == 3 and cell.get("execution_count")
               for cell in saved["cells"] if cell["cell_type"] == "code")
    status = subprocess.run(["git", "-C", str(server.repo), "status", "--porcelain", "--", f"notebooks/{path.stem}.*"],
                            capture_output=True, text=True, check=True, timeout=60).stdout
    assert status == "", status


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
