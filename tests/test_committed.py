"""Saved notebooks keep their outputs; git and ``labkit reproduce`` see only their sources.

In a clone of this repository with the nbstripout filter configured as scripts/setup.sh
configures it (``labkit.lab.gitfilter``), a notebook saved with outputs, execution counts
and the kernel's language_info is unchanged for git and runs as committed, while a
changed parameter (in the .ipynb and its jupytext pair, as JupyterLab saves both) is a
change that ``committed.check`` refuses, naming both files. After a save JupyterLab's
post-save hook (``gitfilter.refresh_after_save``) refreshes the index entry of a notebook
whose only change is outputs, so ``git status`` reads clean too. Without the filter, outputs
read as changes and the refusal says to run ``make setup``.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import nbformat
import pytest

from labkit.errors import LabkitError
from labkit.lab import gitfilter
from labkit.provenance import committed

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def clone(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("committed") / "clone"
    subprocess.run(["git", "clone", "-q", "--no-hardlinks", str(ROOT), str(path)], check=True, timeout=300)
    return path


def _git(repo: Path, *args: str) -> str:
    return subprocess.run(["git", "-C", str(repo), *args], check=True, capture_output=True, text=True,
                          timeout=120).stdout


def _save_with_outputs(path: Path) -> None:
    """What a JupyterLab save writes after Run All: outputs, counts, language_info, widget state."""
    nb = nbformat.read(path, as_version=4)
    for i, cell in enumerate(c for c in nb.cells if c.cell_type == "code"):
        cell.outputs = [nbformat.v4.new_output("stream", name="stdout", text=f"output {i}\n"),
                        nbformat.v4.new_output("display_data", data={"image/png": "iVBORw0KGgo="})]
        cell.execution_count = i + 1
        cell.metadata["execution"] = {"iopub.status.idle": "2026-12-01T10:00:00Z"}
    nb.metadata["language_info"] = {"name": "python", "version": sys.version.split()[0]}
    nb.metadata["widgets"] = {"application/vnd.jupyter.widget-state+json": {"state": {}}}
    nbformat.write(nb, path)


def _restore(repo: Path, *files: str) -> None:
    _git(repo, "checkout", "--", *files)


@pytest.mark.slow
def test_saved_outputs_are_no_change_with_the_filter(clone):
    assert gitfilter.install(clone) is True and gitfilter.install(clone) is False  # idempotent
    nb = clone / "notebooks" / "03_acceptance_by_position.ipynb"
    try:
        _save_with_outputs(nb)
        # the reproduce check compares filtered content with HEAD (git status alone is fooled by the size)
        tags = committed.check([nb])
        assert tags[nb]["lab.notebook_git"] == "committed"
        # JupyterLab's post-save hook refreshes the index entry: git status reads clean, nothing staged
        gitfilter.refresh_after_save({"type": "notebook"}, os_path=str(nb))
        assert _git(clone, "status", "--porcelain", "--", "notebooks") == ""
        assert _git(clone, "diff", "--cached", "--name-only") == ""
        # ... and the working copy still has what the user saw
        assert sum(len(c.outputs) for c in nbformat.read(nb, as_version=4).cells if c.cell_type == "code") > 0
    finally:
        _restore(clone, "notebooks/03_acceptance_by_position.ipynb")


@pytest.mark.slow
def test_a_changed_parameter_is_refused_naming_both_files(clone):
    gitfilter.install(clone)
    ipynb, py = clone / "notebooks" / "02_k_sweep.ipynb", clone / "notebooks" / "02_k_sweep.py"
    try:
        _save_with_outputs(ipynb)
        nb = nbformat.read(ipynb, as_version=4)
        cell = next(c for c in nb.cells if "parameters" in c.metadata.get("tags", []))
        cell.source = cell.source.replace('recipe = "default"', 'recipe = "default"\nruns = 1', 1)
        nbformat.write(nb, ipynb)
        py.write_text(py.read_text().replace('recipe = "default"', 'recipe = "default"\nruns = 1', 1))
        for f in (ipynb, py):  # the hook leaves a real change alone: nothing staged
            gitfilter.refresh_after_save({}, os_path=str(f))
        assert _git(clone, "diff", "--cached", "--name-only") == ""
        assert set(_git(clone, "status", "--porcelain", "--", "notebooks").split()) == {
            "M", "notebooks/02_k_sweep.ipynb", "notebooks/02_k_sweep.py"}
        with pytest.raises(LabkitError) as e:
            committed.check([ipynb])
        assert "notebooks/02_k_sweep.ipynb" in e.value.problem and "notebooks/02_k_sweep.py" in e.value.problem
        assert "make setup" not in e.value.fix  # the filter is there: this is a real change
        # what git would commit is the new parameter without any output
        staged = _git(clone, "diff", "--", "notebooks/02_k_sweep.ipynb")
        assert '"runs = 1' in staged.replace("\\n", "\n") or "runs = 1" in staged
        assert "output 0" not in staged and "image/png" not in staged
    finally:
        _restore(clone, "notebooks/02_k_sweep.ipynb", "notebooks/02_k_sweep.py")


def test_without_the_filter_outputs_count_and_the_fix_says_make_setup(clone):
    for key in ("filter.nbstripout.clean", "filter.nbstripout.smudge", "diff.ipynb.textconv"):
        subprocess.run(["git", "-C", str(clone), "config", "--local", "--unset", key], timeout=30)
    nb = clone / "notebooks" / "01_cost_fit.ipynb"
    try:
        _save_with_outputs(nb)
        with pytest.raises(LabkitError) as e:
            committed.check([nb])
        assert "notebooks/01_cost_fit.ipynb" in e.value.problem and "make setup" in e.value.fix
    finally:
        _restore(clone, "notebooks/01_cost_fit.ipynb")
        gitfilter.install(clone)
