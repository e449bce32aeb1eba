"""docs/benchmarks.md is generated from logged reproductions: one table per host, each row
with its date, commit and LAB IDs, and the same store gives the same file.

The reproductions are written to a real MLflow store through the functions ``labkit
reproduce`` writes with (parent run, notebook runs as its children, ``apply_close``); their
notebook durations are SYNTHETIC (no notebook runs). One slow test runs a real tiny
reproduction under papermill and finds it in the document.
"""

from __future__ import annotations

import importlib.util
import json
import re
import shutil
import sqlite3
import subprocess
import sys
from pathlib import Path

import nbformat
import pytest

from labkit.config.recipe import load
from labkit.errors import LabkitError
from labkit.paths import project_root
from labkit.provenance import fingerprint, runtags, tracking
from labkit.provenance.sync import apply_close
from labkit.report import timings

ROOT = project_root()
SCRIPT = ROOT / "scripts" / "benchmarks-doc.py"


def _reproduction(c, monkeypatch, tmp_path, *, host: str, seconds: dict[str, float], h_ms: float | None = None,
                  busy: float = 0.01, params: dict | None = None, close: bool = True) -> dict:
    """One SYNTHETIC reproduction on ``host``: a parent run and one child per notebook, closed
    as ``labkit reproduce`` closes them, each child with the made-up wall time ``seconds[nb]``."""
    monkeypatch.setenv("LABKIT_HOST_LABEL", host)
    recipe = load(None)
    tags = runtags.flat_tags(fingerprint.collect(recipe=recipe))
    parent = tracking.new_parent_run(c, recipe=recipe, notebooks=list(seconds), output=str(tmp_path / host),
                                     tags=tags)
    results = []
    for nb, secs in seconds.items():
        rid, lab = tracking.new_run(c, notebook=f"{nb}.ipynb", recipe=recipe, parent=parent, tags={
            **tags, "lab.mode": "papermill", "lab.notebook": nb, "machine.busy": busy,
            "papermill.parameters": json.dumps({"recipe": "default", **(params or {})})})
        if h_ms is not None and nb.startswith("01"):
            c.log_metric(rid, "verify/H_ms", h_ms)
        apply_close(c, rid, {"run": lab.run, "type": "close", "status": "FINISHED", "error": None,
                             "seconds": secs, "files": []})
        results.append({"notebook": nb, "id": str(lab), "run_id": rid, "status": "FINISHED"})
    if close:
        tracking.finish_parent(c, parent, tracking.parent_close(parent, results))
    dirty = "+dirty" if str(tags.get("git.dirty")) == "True" else ""  # a checkout with uncommitted changes says so
    return {"parent": parent, "ids": [r["id"] for r in results], "commit": tags["git.commit"][:7] + dirty}


def _sections(text: str) -> dict[str, str]:
    """The generated block's host sections, by host label."""
    parts = re.split(r"^### `([^`]+)`.*$", text, flags=re.M)
    return dict(zip(parts[1::2], parts[2::2]))


@pytest.fixture(scope="module")
def logged(store, tmp_path_factory):
    """Three finished reproductions on two hosts and one still running, in one real store."""
    mp = pytest.MonkeyPatch()
    tmp = tmp_path_factory.mktemp("reps")
    c = tracking.client()
    reps = {
        "a-full": _reproduction(c, mp, tmp, host="box-a", h_ms=28.4,
                                seconds={"01_cost_fit": 80.2, "02_k_sweep": 931.0, "07_concurrency": 3714.6,
                                         "06_results_matrix": 19.0}),
        "b-one": _reproduction(c, mp, tmp, host="box-b", h_ms=12.3, busy=0.35,
                               seconds={"01_cost_fit": 26.0}, params={"verify_rounds": 8}),
        "a-one": _reproduction(c, mp, tmp, host="box-a", h_ms=29.1, seconds={"01_cost_fit": 41.0}),
        "running": _reproduction(c, mp, tmp, host="box-a", seconds={"01_cost_fit": 5.0}, close=False),
    }
    mp.undo()
    return reps


@pytest.mark.slow
def test_one_table_per_host_with_every_row_cited(logged):
    text = timings.render(timings.reproductions(tracking.client()))
    assert text.startswith(timings.BEGIN) and text.rstrip().endswith(timings.END)
    hosts = _sections(text)
    assert set(hosts) == {"box-a", "box-b"}  # one table per host label, in name order
    assert list(hosts) == sorted(hosts)
    a, b = hosts["box-a"], hosts["box-b"]
    for sec in (a, b):  # one table each
        assert sum(ln.startswith("|---") for ln in sec.splitlines()) == 1
    for rid in logged["a-full"]["ids"] + logged["a-one"]["ids"]:
        assert rid in a and rid not in b
    assert logged["b-one"]["ids"][0] in b
    assert logged["running"]["ids"][0] not in text  # not over: its time is not known yet
    rows = [ln for ln in a.splitlines() if ln.startswith("| 20")]
    assert len(rows) == 2
    # newest first; a full reproduction's notebooks in the order it ran them, each its own time
    assert logged["a-one"]["ids"][0] in rows[0] and logged["a-full"]["ids"][0] in rows[1]
    head = next(ln for ln in a.splitlines() if ln.startswith("| date (UTC)"))
    cols = [h.strip() for h in head.strip("|").split("|")]
    assert cols[cols.index("reproduction") + 1:cols.index("H (ms)")] == ["01", "02", "07", "06"]
    full = dict(zip(cols, (v.strip() for v in rows[1].strip("|").split("|"))))
    assert (full["01"], full["02"], full["07"], full["06"]) == ("1 min 20 s", "15 min 31 s", "1 h 1 min 55 s", "19 s")
    assert full["H (ms)"] == "28.4" and full["commit"] == logged["a-full"]["commit"] and full["status"] == "FINISHED"
    assert full["LAB IDs"] == " ".join(logged["a-full"]["ids"])
    one = dict(zip(cols, (v.strip() for v in rows[0].strip("|").split("|"))))
    assert one["02"] == "" and one["01"] == "41 s"  # a notebook it did not run is blank
    brow = next(ln for ln in b.splitlines() if ln.startswith("| 20"))
    assert "verify_rounds=8" in brow and "35%" in brow  # its -p override and the busy machine are said
    assert "01 = `01_cost_fit`" in a and "2 reproductions on box-a" in a


@pytest.mark.slow  # the module's logged-store fixture: ~45 s
def test_regenerating_from_the_same_store_gives_the_same_file(logged, tmp_path):
    doc = tmp_path / "docs" / "benchmarks.md"
    assert timings.write(doc, timings.render(timings.reproductions(tracking.client()))) is True
    first = doc.read_bytes()
    assert timings.write(doc, timings.render(timings.reproductions(tracking.client()))) is False
    assert doc.read_bytes() == first
    # a fresh file from the same store is byte for byte the same, hand-written text outside the markers kept
    doc.write_text("# Measured times\n\nintro\n\n" + timings.render(timings.reproductions(tracking.client()))
                   + "\n## Recorded by hand\n\n| kept |\n")
    kept = doc.read_text()
    assert timings.write(doc, timings.render(timings.reproductions(tracking.client()))) is False
    assert doc.read_text() == kept
    assert "generated at" not in kept.lower()


def test_a_file_without_markers_is_refused_and_left_alone(tmp_path):
    doc = tmp_path / "benchmarks.md"
    doc.write_text("# typed by hand\n")
    with pytest.raises(LabkitError, match="no generated block") as e:
        timings.write(doc, timings.render([]))
    assert "marker" in e.value.fix and doc.read_text() == "# typed by hand\n"
    empty = timings.render([])
    assert "No reproduction is logged" in empty and "make reproduce" in empty


def _script():
    spec = importlib.util.spec_from_file_location("benchmarks_doc", SCRIPT)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


@pytest.mark.slow
def test_script_writes_checks_and_reports_json(logged, tmp_path, capsys):
    doc = tmp_path / "benchmarks.md"
    script = _script()

    def run(*args) -> tuple[int, dict, str]:
        rc = script.main(["--out", str(doc), *args])
        out, err = capsys.readouterr()
        return rc, json.loads(out.strip().splitlines()[-1]), err

    rc, res, err = run()
    assert rc == 0 and res["changed"] is True and set(res["hosts"]) >= {"box-a", "box-b"}
    assert "reading reproductions" in err
    rc, res, _ = run("--check")
    assert rc == 0 and res["up_to_date"] is True
    doc.write_text(doc.read_text().replace("box-b", "box-c"))
    rc, res, err = run("--check")
    assert rc == 1 and res["up_to_date"] is False and "differs from the store" in err
    with pytest.raises(SystemExit):
        script.main(["--help"])
    assert "--check" in capsys.readouterr().out
    # --store, repeated: the reproductions of real stores merged by run id (a copy of the store
    # holds the same runs: they count once), and the process's MLFLOW_TRACKING_URI is left as it was
    uri = tracking.tracking_uri()
    copy = tmp_path / "copy.db"
    with sqlite3.connect(uri.removeprefix("sqlite:///")) as src, sqlite3.connect(copy) as dst:
        src.backup(dst)  # a consistent copy, whatever the journal mode
    other = f"sqlite:///{tmp_path / 'other' / 'mlflow.db'}"
    (tmp_path / "other").mkdir()
    mp = pytest.MonkeyPatch()
    _reproduction(tracking.client(uri=other), mp, tmp_path, host="box-z", seconds={"01_cost_fit": 33.0})
    mp.undo()
    rc, one, _ = run("--check")
    rc, both, err = run("--store", uri, "--store", f"sqlite:///{copy}", "--store", other)
    assert rc == 0 and both["reproductions"] == one["reproductions"] + 1 and "box-z" in both["hosts"]
    assert err.count("reading reproductions from") == 3 and tracking.tracking_uri() == uri
    assert "box-z" in _sections(doc.read_text())
    # --keep: the rows of stores that are gone stay as they were written; the store read
    # regenerates its own rows (once: the kept copy of a row it regenerates is dropped)
    full = doc.read_text()
    rc, res, _ = run("--keep", "--store", other)
    kept = doc.read_text()
    assert rc == 0 and res["reproductions"] == 1
    assert kept.replace("\n" + timings.KEPT, "") == full
    for rid in logged["a-full"]["ids"] + logged["b-one"]["ids"] + logged["a-one"]["ids"]:
        assert kept.count(rid) == 1
    rc, res, _ = run("--keep", "--check", "--store", other)
    assert rc == 0 and res["up_to_date"] is True
    rc, res, _ = run("--check", "--store", other)  # without --keep, box-a's and box-b's rows would go
    assert rc == 1
    # bad input, as a user meets it: exit 2, the problem and the fix on stderr, the file untouched
    doc.write_text("no markers\n")
    r = subprocess.run([sys.executable, str(SCRIPT), "--out", str(doc)], capture_output=True, text=True, timeout=300)
    assert r.returncode == 2 and "no generated block" in r.stderr and "fix:" in r.stderr
    assert doc.read_text() == "no markers\n"


@pytest.mark.slow  # papermill
def test_a_real_reproduction_is_in_the_document(store, tmp_path, monkeypatch):
    from labkit.provenance import reproduce as rp

    nbs = tmp_path / "notebooks"
    nbs.mkdir()
    book = nbformat.v4.new_notebook()
    book.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    cell = nbformat.v4.new_code_cell('recipe = "default"')
    cell.metadata["tags"] = ["parameters"]
    book.cells += [cell, nbformat.v4.new_code_cell("import time\ntime.sleep(1)")]
    nbformat.write(book, nbs / "88_tiny.ipynb")
    monkeypatch.setenv("LABKIT_NOTEBOOKS", str(nbs))
    monkeypatch.setenv("LABKIT_ROOT", str(tmp_path / "root"))
    monkeypatch.setenv("LABKIT_HOST_LABEL", "real-box")
    (tmp_path / "root" / "experiments").mkdir(parents=True)
    shutil.copy(ROOT / "experiments" / "default.yaml", tmp_path / "root" / "experiments")
    summary = rp.reproduce(only=["88"], out_dir=str(tmp_path / "out"))
    assert summary["ok"], summary
    res = summary["results"][0]
    section = _sections(timings.render(timings.reproductions(tracking.client())))["real-box"]
    row = next(ln for ln in section.splitlines() if res["id"] in ln)
    logged = tracking.client().get_run(res["run_id"]).data.metrics["lab/seconds"]
    # the notebook's own logged wall time (the summary's seconds are rounded to 0.1 s first, so
    # 2.54 s would read "2 s" there and "3 s" here); and it is this run's, not another's
    header = next(ln for ln in section.splitlines() if ln.startswith("|"))
    column = [c.strip() for c in header.split("|")].index("88")  # the notebook's own column
    assert [c.strip() for c in row.split("|")][column] == timings.clock(logged), (header, row)
    assert abs(logged - res["seconds"]) <= 0.06
    assert "| FINISHED |" in row and "88 = `88_tiny`" in section
    assert Path(res["executed"]).exists()


def test_one_table_per_cpu_when_boxes_share_a_host_label(store, monkeypatch, tmp_path):
    """The sessions' boxes are all "vm", "AMD EPYC": the CPU's family, model and ISA
    (``host.cpu_id``) keeps a Zen 2 box's minutes out of a Zen 3 box's table."""
    cpuinfo = Path(__file__).parent / "fixtures" / "cpuinfo" / "epyc-family25-model1.txt"  # recorded
    zen2 = tmp_path / "cpuinfo-23"  # constructed from it: family and model edited
    zen2.write_text(cpuinfo.read_text().replace("cpu family\t: 25", "cpu family\t: 23")
                    .replace("model\t\t: 1\n", "model\t\t: 49\n"))
    c = tracking.client()
    made = {}
    for name, path in (("zen3", cpuinfo), ("zen2", zen2)):
        monkeypatch.setattr(fingerprint, "CPUINFO", str(path))
        made[name] = _reproduction(c, monkeypatch, tmp_path, host="cpu-box", h_ms=20.0,
                                   seconds={"01_cost_fit": 30.0})
    text = timings.render(timings.reproductions(c))
    heads = [ln for ln in text.splitlines() if ln.startswith("### `cpu-box`")]
    assert len(heads) == 2
    assert any("AMD EPYC (AuthenticAMD family 25 model 1 stepping 1, AVX2)" in h for h in heads)
    assert any("AMD EPYC (AuthenticAMD family 23 model 49 stepping 1, AVX2)" in h for h in heads)
    sections = text.split("### `cpu-box`")[1:]
    for name, fam in (("zen3", "family 25"), ("zen2", "family 23")):
        sec = next(s for s in sections if fam in s.splitlines()[0])
        assert made[name]["ids"][0] in sec
        assert made["zen2" if name == "zen3" else "zen3"]["ids"][0] not in sec
