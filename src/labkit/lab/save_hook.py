"""Saving a notebook in JupyterLab must not change what ``labkit reproduce`` runs.

JupyterLab autosaves every couple of minutes. Without this hook a tracked notebook
gains its outputs (hundreds of lines of tables and base64 figures), execution counts and
the kernel's ``language_info``, and becomes a diff nobody meant to make. Outputs live in
MLflow (every cell, table and figure is logged under its ``[LAB: …]`` ID, and a
reproduction logs the executed notebook as HTML), so the file on disk keeps only what a
reproduction reads: the cells' sources, their tags, and the notebook's kernelspec and
jupytext pairing. Jupytext writes the paired ``.py`` from the same model, so pairing
is untouched.

Wired in by ``jupyter-config/jupyter_server_config.py`` (``make lab`` passes it with
``--config``) as the contents manager's ``pre_save_hook``.
"""

from __future__ import annotations

# metadata the front end adds on save that a reproduction never reads
NOTEBOOK_METADATA_DROPPED = ("language_info", "widgets")
CELL_METADATA_DROPPED = ("execution", "collapsed", "scrolled")


def strip_notebook(nb: dict) -> dict:
    """Drop outputs, execution counts and front-end metadata from a notebook dict, in place."""
    for key in NOTEBOOK_METADATA_DROPPED:
        nb.get("metadata", {}).pop(key, None)
    for cell in nb.get("cells", []):
        for key in CELL_METADATA_DROPPED:
            cell.get("metadata", {}).pop(key, None)
        if cell.get("cell_type") == "code":
            cell["outputs"] = []
            cell["execution_count"] = None
    return nb


def strip_outputs(model: dict, path: str = "", contents_manager=None, **kwargs) -> None:
    """``ContentsManager.pre_save_hook``: strip a notebook model before it is written."""
    if model.get("type") == "notebook" and isinstance(model.get("content"), dict):
        strip_notebook(model["content"])
