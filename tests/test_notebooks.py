"""Notebooks stay thin and diff-friendly: paired with jupytext sources, no committed outputs
(a saved working copy keeps its outputs: the nbstripout git filter keeps them out of git),
a parameters cell whose names are recipe fields (or documented extras)."""

from __future__ import annotations

import ast

import jupytext
import nbformat
import pytest

from labkit.config.recipe import RECIPE_FIELDS
from labkit.errors import LabkitError
from labkit.provenance.reproduce import declared_parameters, discover, notebooks_dir

NOTEBOOKS = sorted(notebooks_dir().glob("[0-9][0-9]_*.ipynb"))
EXTRA_PARAMETERS = {"recipe", "workload"}  # the recipe to load; 06's workload pooling


def test_there_are_notebooks():
    assert [p.stem for p in NOTEBOOKS][:2] == ["01_cost_fit", "02_k_sweep"]


def test_a_full_reproduction_runs_the_results_matrix_after_every_measuring_notebook():
    """06 reads the newest run of every other notebook (07's concurrency for §B included), so
    the whole suite runs it last and its matrix cites this reproduction's own runs."""
    order = [p.stem for p in discover()]
    assert order[-1] == "06_results_matrix" and sorted(order) == [p.stem for p in NOTEBOOKS]
    assert order[:-1] == sorted(order[:-1])  # the rest in number order
    assert [p.stem for p in discover(["06", "07"])] == ["06_results_matrix", "07_concurrency"]  # as asked


@pytest.mark.parametrize("nb", NOTEBOOKS, ids=lambda p: p.stem)
def test_paired_source_in_sync_and_outputs_stripped(nb):
    paired = nb.with_suffix(".py")
    assert paired.exists(), f"{nb.name} needs its jupytext pair {paired.name}"
    a = nbformat.read(nb, as_version=4)
    b = jupytext.read(paired)
    src = lambda n: [(c.cell_type, c.source.strip()) for c in n.cells]  # noqa: E731
    assert src(a) == src(b), f"{nb.name} and {paired.name} differ: run `jupytext --sync {paired}`"
    # outputs may be in the working copy (a saved notebook keeps them); never in what git holds
    for cell in _as_committed(nb).cells:
        if cell.cell_type == "code":
            assert not cell.outputs and cell.execution_count is None, f"{nb.name} has committed outputs"


def _as_committed(nb):
    """The notebook as git's index holds it (the working file outside a git checkout)."""
    import subprocess

    shown = subprocess.run(["git", "-C", str(nb.parent), "show", f":./{nb.name}"], capture_output=True, text=True,
                           timeout=60)
    return nbformat.reads(shown.stdout, as_version=4) if shown.returncode == 0 else nbformat.read(nb, as_version=4)


@pytest.mark.parametrize("nb", NOTEBOOKS, ids=lambda p: p.stem)
def test_parameters_are_recipe_fields(nb):
    declared = declared_parameters(nb)
    assert "recipe" in declared
    assert set(declared) <= RECIPE_FIELDS | EXTRA_PARAMETERS


@pytest.mark.parametrize("nb", NOTEBOOKS, ids=lambda p: p.stem)
def test_each_notebooks_own_parameters_make_a_valid_default_recipe(nb):
    """`make reproduce` runs every notebook on the default recipe with the notebook's own
    parameter values over it: they must agree (07's runs = 3 against the default's
    max_runs = 2 stopped a whole reproduction)."""
    from labkit.config.recipe import effective_recipe

    params = {name: ast.literal_eval(p["default"]) for name, p in declared_parameters(nb).items()}
    effective_recipe({**params, "recipe": "default"})  # raises LabkitError on a conflict


@pytest.mark.parametrize("nb", NOTEBOOKS, ids=lambda p: p.stem)
def test_notebooks_are_thin(nb):
    """No function or class definitions and no loops over measurements in notebooks: logic lives in labkit."""
    for cell in nbformat.read(nb, as_version=4).cells:
        if cell.cell_type != "code":
            continue
        tree = ast.parse(cell.source)
        for node in ast.walk(tree):
            assert not isinstance(node, (ast.FunctionDef, ast.ClassDef, ast.AsyncFunctionDef)), nb.name
            # loops over measurements belong in labkit (a comprehension building drafters is fine)
            assert not isinstance(node, (ast.For, ast.While, ast.AsyncFor)), f"{nb.name}: a loop in a notebook cell"
        assert len(cell.source.splitlines()) <= 25, f"{nb.name}: a long cell belongs in src/labkit"


def test_a_parameter_line_papermill_cannot_parse_is_refused(tmp_path):
    """Papermill skips a parameters line it cannot parse (a warning only); the run would then
    refuse that parameter as undeclared. Refuse at the cell instead, naming the line."""
    nb = nbformat.v4.new_notebook(metadata={"kernelspec": {"name": "python3", "display_name": "Python 3",
                                                          "language": "python"}})
    cell = nbformat.v4.new_code_cell('recipe = "default"\nk = None  # (a list: <= 2 values)\n')
    cell.metadata["tags"] = ["parameters"]
    nb.cells.append(cell)
    p = tmp_path / "bad.ipynb"
    nbformat.write(nb, p)
    with pytest.raises(LabkitError) as e:
        declared_parameters(p)
    assert "'k'" in e.value.problem and "<= 2 values" in e.value.problem
