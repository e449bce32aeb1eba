"""Which notebook this kernel is running, as far as the front end lets a kernel know.

A kernel is not told which notebook it serves; each front end leaves a different trace:

- JupyterLab / Jupyter Server start a notebook's kernel with ``JPY_SESSION_NAME`` set to
  the notebook's path (jupyter_server ``SessionManager.get_kernel_env``: the absolute
  path when the session has a name, else the path relative to the server root), and
  ipykernel copies it into the namespace as ``__session__``.
- VS Code sets ``__vsc_ipynb_file__`` in the namespace.
- ``labkit reproduce`` (papermill) sets ``LABKIT_NOTEBOOK``.

From the ``.ipynb`` on disk we also learn the notebook's last code cell, which is how an
interactive run knows it has finished: JupyterLab sends each cell's nbformat ``id`` with
the execute request (``cellId``), IPython hands it to the post-run hook, and a cell whose
id (or, from front ends that send none, whose source) is the last code cell's ends the run.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path

DEFAULT = "00_interactive"


@dataclass(frozen=True)
class Notebook:
    name: str  # the stem: "02_k_sweep"
    origin: str  # where the name came from, said in the start() line
    path: Path | None = None  # the .ipynb, when it could be found
    last_cell_id: str | None = None
    last_cell_source: str | None = None
    code_cells: int | None = None

    def is_last_cell(self, cell_id: str | None, source: str) -> bool:
        """Whether the cell that just ran is the notebook's last code cell."""
        if cell_id and self.last_cell_id:
            return cell_id == self.last_cell_id
        return self.last_cell_source is not None and source.strip() == self.last_cell_source


def locate(namespace: dict, explicit: str | None = None) -> Notebook:
    """The notebook's name and, where the file can be read, its last code cell."""
    session = os.environ.get("JPY_SESSION_NAME") or namespace.get("__session__")
    candidates = [
        (explicit, "start(notebook=...)"),
        (os.environ.get("LABKIT_NOTEBOOK"), "labkit reproduce"),
        (session if session and str(session).endswith(".ipynb") else None, "JupyterLab session"),
        (namespace.get("__vsc_ipynb_file__"), "VS Code"),
    ]
    for value, origin in candidates:
        if value:
            return _read(Path(str(value)), origin)
    return Notebook(DEFAULT, "no notebook named by the front end")


def _read(given: Path, origin: str) -> Notebook:
    path = _find(given)
    if path is None:
        return Notebook(given.stem, origin)
    try:
        nb = json.loads(path.read_text())
        code = [c for c in nb.get("cells", []) if c.get("cell_type") == "code"]
    except (OSError, ValueError, AttributeError):
        return Notebook(given.stem, origin, path)
    last = code[-1] if code else {}
    src = last.get("source", "")
    return Notebook(given.stem, origin, path, last.get("id"), ("".join(src) if isinstance(src, list) else src).strip()
                    if code else None, len(code))


def _find(given: Path) -> Path | None:
    """The .ipynb: as given (absolute, or relative to the cwd), else beside the kernel (a
    notebook's kernel starts in the notebook's folder, and a relative session path is
    relative to the server root, not to that folder)."""
    if given.suffix != ".ipynb":
        given = given.with_suffix(".ipynb")
    for p in (given, Path.cwd() / given.name):
        if p.is_file():
            return p.resolve()
    return None
