"""The notebook side of provenance: one MLflow run per notebook run, every cell logged.

A notebook's second cell is ``lab = labkit.lab.start(globals())``. From then on an
IPython ``post_run_cell`` hook logs each executed cell (index, source hash, duration,
status, and the metrics, tables and figures it produced) under its ``[LAB: …]`` ID.
Cells that ran before ``start`` (the parameters) are logged from the kernel's history.

Under ``labkit reproduce`` the run already exists (``LABKIT_RUN_ID``); interactively,
``start`` creates it. Each record goes first to a local journal (JSON lines) and then
to MLflow, so a tracking store that fails mid-run loses nothing already measured.
"""

from __future__ import annotations

import ast
import json


def _assigned_names(source: str) -> list[str]:
    try:
        tree = ast.parse(source)
    except SyntaxError:
        return []
    names = []
    for node in tree.body:
        targets = node.targets if isinstance(node, ast.Assign) else [node.target] if isinstance(node, ast.AnnAssign) else []
        names += [t.id for t in targets if isinstance(t, ast.Name)]
    return names


def _display(obj) -> None:
    try:
        from IPython.display import display

        display(obj)
    except ImportError:
        pass


def _display_md(text: str) -> None:
    try:
        from IPython.display import Markdown, display

        display(Markdown(text))
    except ImportError:
        pass


def _jsonable(v) -> bool:
    try:
        json.dumps(v)
        return True
    except (TypeError, ValueError):
        return False


def _ipython():
    try:
        from IPython import get_ipython

        return get_ipython()
    except ImportError:
        return None
