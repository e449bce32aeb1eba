"""The MLflow UI as a user reads it, in headless Chromium (Debian's chromium and
chromium-driver under selenium; nothing downloads a browser).

A store holds two small reproductions of 01_cost_fit; ``labkit ui`` serves it on
127.0.0.1 as a user starts it. From the link it prints, in a fresh browser, clicking each
experiment labkit created lands on its runs table and a run opens in "Model training"
mode, with the MLflow Assistant closed (judged by what the page shows, not the URL). The
runs are told apart by their LAB IDs, a run page shows plain-string effective params, its
description and metric charts grouped by section, a figure and a table render in the
artifact viewer, and the compare view lines the two runs up. SIGTERM to ``labkit ui``
(as a service manager sends) stops every process of its server.

Set ``UI_SCREENSHOTS=/some/dir`` to keep screenshots of each page.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
import urllib.parse
import urllib.request
from pathlib import Path

import pytest

import browser
import procs
import servers
import tiny
from labkit.provenance import reproduce as rp
from labkit.provenance import tracking

FAST = tiny.FAST_01
pytestmark = pytest.mark.slow  # a real `mlflow server`, headless Chromium, two reproductions

STARTUP_S = 300  # mlflow server on a busy 2-core box (load 20 seen)
PAGE_S = 120  # the first page of a cold server loads MLflow's whole JS bundle (load 20 seen)

if not (os.access(browser.CHROMIUM, os.X_OK) and os.access(browser.CHROMEDRIVER, os.X_OK)):
    pytest.skip(f"Chromium is not installed ({browser.CHROMIUM}, {browser.CHROMEDRIVER}): "
                "apt-get install -y chromium chromium-driver (scripts/system-deps.sh)", allow_module_level=True)


@pytest.fixture(scope="module")
def runs(store):
    """Two reproductions of 01_cost_fit: their parent runs, children and experiment."""
    # wait=: another reproduction into this checkout (a colleague's, another test's) is queued behind
    out = [rp.reproduce(only=["01_cost_fit"], out_dir=str(store / f"out{i}"), params=FAST, wait=1200)
           for i in range(2)]
    assert all(s["ok"] for s in out), out
    c = tracking.client()
    children = [c.get_run(s["results"][0]["run_id"]) for s in out]
    return {"exp": children[0].info.experiment_id, "runs": children, "ids": [r.data.tags["lab.id"] for r in children]}


class Ui(str):
    """The base URL of a running ``labkit ui`` (a str, as the tests use it), its process and log."""

    proc: subprocess.Popen
    log: Path


@pytest.fixture(scope="module")
def ui(store, runs, tmp_path_factory):
    """``labkit ui`` on the store, on a free 127.0.0.1 port, as a user runs it; always stopped."""
    port = servers.free_port()
    log_path = tmp_path_factory.mktemp("mlflow-ui") / "server.log"
    log = open(log_path, "w")
    proc = subprocess.Popen([sys.executable, "-m", "labkit.cli", "ui", "--port", str(port)],
                            stdout=log, stderr=subprocess.STDOUT)
    base = Ui(f"http://127.0.0.1:{port}")
    base.proc, base.log = proc, log_path
    try:
        servers.wait_for_http(f"{base}/health", proc, timeout=STARTUP_S, what="labkit ui", log=log_path)
        yield base
    finally:
        servers.stop(proc)
        log.close()


def _printed_link(ui: Ui) -> str:
    m = re.search(r"MLflow UI on (http://127\.0\.0\.1:\d+/\S*)", ui.log.read_text())
    assert m, ui.log.read_text()[-2000:]
    return m.group(1)


# What the page shows in MLflow 3.17.2's "Model training" mode and not in its GenAI mode
# (the sidebar's model registry link; the run page's metric tabs), and the reverse.
TRAINING_MARKS = ("Model registry",)
GENAI_MARKS = ("Observability", "Evaluation", "Detect Issues", "MLflow Assistant")


def _assert_training_mode(body: str, where: str) -> None:
    assert all(m in body for m in TRAINING_MARKS), (where, body[:600])
    assert not [m for m in GENAI_MARKS if m in body], (where, [m for m in GENAI_MARKS if m in body])


def test_from_the_printed_link_every_experiment_opens_on_its_runs_in_model_training(ui, runs):
    """A fresh browser (nothing in its localStorage), as a new user meets `labkit ui`."""
    c = tracking.client()
    exps = [e for e in c.search_experiments() if e.name != "Default"]
    assert {"01_cost_fit"} <= {e.name for e in exps}
    link = _printed_link(ui)
    assert link.startswith(ui)
    with browser.chromium(page_load_timeout=PAGE_S) as page:
        for exp in exps:
            _open(page, link, exp.name)
            if exp is exps[0]:
                _shot(page, "mlflow-experiments")
            target = browser.wait_for_link(page, exp.name, timeout=PAGE_S)
            target.click()  # as a user does: the list's link carries no workflowType
            names = [r.info.run_name for r in c.search_runs([exp.experiment_id])]
            assert names, exp.name
            for n in names:
                browser.wait_for_text(page, n, timeout=PAGE_S)
            body = page.find_element("tag name", "body").text
            assert "Run Name" in body and "matching run" in body, body[:600]  # the runs table
            _assert_training_mode(body, f"experiment {exp.name}")
            if exp.name == "01_cost_fit":
                _shot(page, "mlflow-runs")
            browser.wait_for_link(page, names[0], timeout=PAGE_S).click()
            browser.wait_for_text(page, "Model metrics", timeout=PAGE_S)
            browser.wait_for_text(page, "Parameters", timeout=PAGE_S)
            body = page.find_element("tag name", "body").text
            assert "System metrics" in body and "Artifacts" in body, body[:600]
            _assert_training_mode(body, f"a run of {exp.name}")
            if exp.name == "01_cost_fit":
                _shot(page, "mlflow-run-page")


@pytest.fixture(scope="module")
def page():
    with browser.chromium(page_load_timeout=PAGE_S) as d:
        yield d


def _shot(driver, name: str) -> None:
    where = os.environ.get("UI_SCREENSHOTS")
    if where:
        Path(where).mkdir(parents=True, exist_ok=True)
        browser.screenshot(driver, Path(where) / f"{name}.png")


def _open(driver, url: str, *texts: str) -> str:
    driver.get(url)
    for t in texts:
        browser.wait_for_text(driver, t, timeout=PAGE_S)
    return driver.find_element("tag name", "body").text


def _open_artifact(driver, ui: str, runs: dict, run, path: str) -> None:
    """Open a file in the run's artifact viewer by clicking down its folder tree, as a user does."""
    from selenium.webdriver.support.ui import WebDriverWait

    _open(driver, f"{ui}/#/experiments/{runs['exp']}/runs/{run.info.run_id}/artifacts", path.split("/")[0])
    for part in path.split("/"):
        node = WebDriverWait(driver, PAGE_S, poll_frequency=0.25).until(
            lambda d, part=part: [e for e in d.find_elements("xpath", f"//*[normalize-space(text())='{part}']")
                                  if e.is_displayed()], message=f"{part!r} of {path} not in the artifact tree")
        node[-1].click()


def _row(driver, key: str) -> str:
    """The text of the table row (ARIA row or <tr>) whose cell reads exactly ``key``."""
    rows = driver.find_elements("xpath", f"//*[@role='row' or self::tr][.//*[normalize-space(text())='{key}']]")
    assert rows, f"no row for {key!r} on {driver.current_url}"
    return rows[0].text.replace("\n", " | ")


def test_experiment_opens_on_its_runs_named_by_lab_id(ui, runs, page):
    # the kind MLflow 3.x reads to open an experiment on its runs rather than on traces
    exp = tracking.client().get_experiment(runs["exp"])
    assert exp.tags[tracking.EXPERIMENT_KIND_TAG] == "custom_model_development"
    # a fresh browser starts in the GenAI view; `labkit ui` prints this link to the runs
    body = _open(page, f"{ui}/#/experiments/{runs['exp']}?workflowType=machine_learning", *runs["ids"])
    assert "/runs" in page.current_url.split("#", 1)[1]  # the runs tab, not the GenAI traces/overview
    for run, lab_id in zip(runs["runs"], runs["ids"]):
        assert run.info.run_name == f"01_cost_fit · default · {lab_id}" and run.info.run_name in body
    _shot(page, "mlflow-runs")


def test_run_page_shows_effective_params_note_and_metric_sections(ui, runs, page):
    run = runs["runs"][0]
    _open(page, f"{ui}/#/experiments/{runs['exp']}/runs/{run.info.run_id}", "verify_rounds", runs["ids"][0])
    assert _row(page, "verify_rounds").endswith("| 3")
    assert _row(page, "recipe").endswith("| default")  # a plain string, no JSON quotes
    assert _row(page, "verify_m").endswith("| [1, 2, 3]")
    assert _row(page, "kv_depth").endswith("| 32")
    assert _row(page, "cost_models").endswith('| ["synthetic-dense", "synthetic-moe"]')  # None -> the recipe's
    body = page.find_element("tag name", "body").text
    assert "Found:" in body and "verify/H_ms" in body  # the description (mlflow.note.content)
    _shot(page, "mlflow-run")
    # charts grouped into sections by the key before "/": a section title, then its chart count
    # (charts below the fold render lazily, so the section titles are what is asserted)
    body = _open(page, f"{ui}/#/experiments/{runs['exp']}/runs/{run.info.run_id}/model-metrics", "synthetic",
                 "verify")
    lines = [ln.strip() for ln in body.splitlines()]
    sections = {a for a, b in zip(lines, lines[1:]) if re.fullmatch(r"\(\d+\)", b)}
    assert {"verify", "synthetic", "lab"} <= sections, sections
    _shot(page, "mlflow-run-metrics")


def test_figure_and_table_render_in_the_artifact_viewer(ui, runs, page):
    run = runs["runs"][0]
    c = tracking.client()
    png = next(a.path for a in c.list_artifacts(run.info.run_id, "figures/cost-fit") if a.path.endswith(".png"))
    _open_artifact(page, ui, runs, run, png)
    deadline = time.monotonic() + PAGE_S
    while True:
        # the viewer loads the file and shows it as an <img> (its src a blob or get-artifact URL)
        imgs = [i for i in page.find_elements("tag name", "img")
                if page.execute_script("return arguments[0].complete && arguments[0].naturalWidth > 300", i)]
        if imgs:
            break
        assert time.monotonic() < deadline, f"the figure {png} did not render"
        time.sleep(0.5)
    _shot(page, "mlflow-figure")
    _open_artifact(page, ui, runs, run, "tables/verify-per-m/table.json")  # logged with log_table
    browser.wait_for_text(page, "median_ms", timeout=PAGE_S)
    cells = [e.text for e in page.find_elements("xpath", "//*[@role='cell' or self::td]")]
    assert {"1", "2", "3"} <= set(cells), cells[:20]  # m = 1..3, one row each
    _shot(page, "mlflow-table")


def test_compare_view_lines_up_the_two_runs(ui, runs, page):
    ids = [r.info.run_id for r in runs["runs"]]
    url = (f"{ui}/#/compare-runs?runs=" + urllib.parse.quote(json.dumps(ids))
           + "&experiments=" + urllib.parse.quote(json.dumps([runs["exp"]])))
    body = _open(page, url, *runs["ids"], "verify_rounds")
    assert "Comparing 2 Runs" in body
    row = _row(page, "verify_rounds")
    assert row.count("3") >= 2 and '"' not in row
    assert _row(page, "recipe").count("default") == 2 and '"' not in _row(page, "recipe")
    assert "synthetic/expert_term_ms_per_row" in body and "lab/seconds" in body  # section/name keys
    _shot(page, "mlflow-compare")


def test_each_reproduction_is_a_parent_of_its_notebook_run(runs):
    c = tracking.client()
    for run in runs["runs"]:
        parent = c.get_run(run.data.tags["mlflow.parentRunId"])
        assert parent.info.status == "FINISHED" and run.data.tags["lab.id"] in parent.data.tags["mlflow.note.content"]
        assert run.data.tags["mlflow.source.git.commit"] == run.data.tags["git.commit"]
        assert any(k.startswith("system/cpu") for k in run.data.metrics)
        assert "notebook/01_cost_fit.html" in [a.path for a in c.list_artifacts(run.info.run_id, "notebook")]


def test_sigterm_stops_labkit_ui_and_its_server_processes(ui):
    """Last in this module: it stops the module's `labkit ui`, as a service manager would."""
    below = procs.descendants(ui.proc.pid)
    assert below, "labkit ui runs its server as child processes"
    ui.proc.send_signal(signal.SIGTERM)
    assert ui.proc.wait(timeout=120) == 0
    assert procs.wait_gone(below, 60) == [], [procs.cmdline(p) for p in below if procs.alive(p)]
    assert "stopped (SIGTERM)" in ui.log.read_text()
    with pytest.raises(OSError):
        urllib.request.urlopen(f"{ui}/health", timeout=5)
