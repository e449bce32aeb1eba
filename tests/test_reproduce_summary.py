"""`labkit reproduce` ends the terminal with the human summary: the whole record goes to the
output folder's summary.json, and to stdout only with --json.

Real papermill, a real kernel, a real MLflow store, on a SYNTHETIC one-metric notebook
written by the test (the cheapest reproduction there is)."""

from __future__ import annotations

import json
from pathlib import Path

import nbformat
import pytest

from labkit.cli import main


@pytest.fixture
def nb_dir(tmp_path, monkeypatch):
    d = tmp_path / "notebooks"
    d.mkdir()
    monkeypatch.setenv("LABKIT_NOTEBOOKS", str(d))
    nb = nbformat.v4.new_notebook()
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    for i, src in enumerate(['recipe = "default"', "from labkit import lab as L\nlab = L.start(globals())",
                             "lab.metric('value', 1.0)"]):  # SYNTHETIC
        cell = nbformat.v4.new_code_cell(src)
        cell.metadata["tags"] = ["parameters"] if i == 0 else []
        nb.cells.append(cell)
    nbformat.write(nb, d / "88_summary.ipynb")
    return d


@pytest.mark.slow  # papermill, twice
def test_terminal_ends_with_the_human_summary_and_json_only_on_request(store, nb_dir, tmp_path, capsys):
    rc = main(["reproduce", "--only", "88", "--out", str(tmp_path / "a")])
    cap = capsys.readouterr()
    assert rc == 0, cap.err[-3000:]
    assert cap.out.strip() == "", "without --json nothing machine-readable reaches the terminal"
    last = cap.err.strip().splitlines()[-1]
    record = tmp_path / "a" / "summary.json"
    assert last.endswith(f"labkit reproduce: ok: 1/1 notebooks finished, 0 metric(s) moved; recipe default; "
                         f"the whole record: {record}"), last
    summary = json.loads(record.read_text())
    assert summary["ok"] and summary["results"][0]["notebook"] == "88_summary"
    assert f"[{summary['results'][0]['id']}] 88_summary" in cap.err  # the IDs produced are in the human part

    rc = main(["reproduce", "--only", "88", "--json", "--out", str(tmp_path / "b")])
    cap = capsys.readouterr()
    assert rc == 0, cap.err[-3000:]
    printed = json.loads(cap.out.strip().splitlines()[-1])
    written = json.loads(Path(printed["output"], "summary.json").read_text())
    assert printed["output"] == str(tmp_path / "b") and printed["ok"] is written["ok"] is True
    assert [r["id"] for r in printed["results"]] == [r["id"] for r in written["results"]]
    assert "labkit reproduce: ok: 1/1" in cap.err.strip().splitlines()[-1]  # stderr still ends with the summary
