"""Notebook outputs stay on disk and out of git: the ``nbstripout`` clean filter.

A notebook saved in JupyterLab keeps its outputs, so whoever ran it finds the figures
when they reopen it. Git reads the notebooks through nbstripout (``.gitattributes``
names ``notebooks/*.ipynb``), so ``git status``, ``git diff``, ``git add`` and
``labkit reproduce``'s check of the committed notebooks (provenance/committed.py) see
the sources only: outputs, execution counts and the front end's metadata are dropped;
cell ids, tags, the kernelspec and the jupytext pairing stay (``--keep-id``: JupyterLab
sends those ids with each cell, and labkit logs cells by them). A changed parameter is
a changed source: git shows it, in the ``.ipynb`` and its paired ``.py``.

The filter is per clone (``.git/config``), run by the venv's Python: ``scripts/setup.sh``
runs ``python -m labkit.lab.gitfilter``. A clone without it reads saved outputs as
changes, and ``labkit reproduce`` says to run ``make setup``.
"""

from __future__ import annotations

import shlex
import subprocess
import sys
from pathlib import Path

NAME = "nbstripout"  # the filter's name in .gitattributes
# metadata nbstripout does not drop by default but a save or a papermill run adds
EXTRA_KEYS = ("metadata.language_info", "metadata.widgets", "metadata.papermill", "cell.metadata.papermill",
              "cell.metadata.execution")


def clean_command(python: str | None = None) -> str:
    """The filter's clean command (git runs it with a shell)."""
    return " ".join([shlex.quote(python or sys.executable), "-m", "nbstripout", "--keep-id",
                     "--extra-keys", shlex.quote(" ".join(EXTRA_KEYS))])


def install(repo: str | Path, *, python: str | None = None) -> bool:
    """Configure the filter in ``repo``'s own git config; True when something changed."""
    clean = clean_command(python)
    want = {f"filter.{NAME}.clean": clean, f"filter.{NAME}.smudge": "cat", "diff.ipynb.textconv": f"{clean} -t"}
    changed = False
    for key, value in want.items():
        have = subprocess.run(["git", "-C", str(repo), "config", "--local", "--get", key],
                              capture_output=True, text=True, timeout=30)
        if have.stdout.rstrip("\n") != value:
            subprocess.run(["git", "-C", str(repo), "config", "--local", key, value], check=True, timeout=30)
            changed = True
    return changed


def refresh_after_save(model=None, os_path: str = "", contents_manager=None, **kwargs) -> None:
    """``ContentsManager.post_save_hook`` (jupyter-config/): after a save that changed only
    what the filter drops (outputs), refresh the file's index entry so ``git status`` reads
    clean. Git reports any file whose size changed as modified without running the clean
    filter; ``git add`` of a file whose filtered content is already the index's stages
    nothing and records the new size. A file whose sources changed is left alone."""
    path = Path(os_path)
    if not path.is_file():
        return
    try:
        attr = _git(path.parent, "check-attr", "filter", "--", path.name)
        if not attr.stdout.strip().endswith(f": {NAME}"):
            return
        now = _git(path.parent, "hash-object", "--path", path.name, "--", path.name)
        staged = _git(path.parent, "rev-parse", "-q", "--verify", f":./{path.name}")
        if now.returncode == 0 and staged.returncode == 0 and now.stdout.strip() == staged.stdout.strip():
            _git(path.parent, "add", "--", path.name)
    except (OSError, subprocess.SubprocessError):
        pass  # a save never fails on git's account


def _git(cwd: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(["git", "-C", str(cwd), *args], capture_output=True, text=True, timeout=60)


def main(argv=None) -> int:
    repo = Path(argv[0] if argv else ".")
    inside = subprocess.run(["git", "-C", str(repo), "rev-parse", "--is-inside-work-tree"],
                            capture_output=True, text=True, timeout=30)
    if inside.returncode != 0:
        print(f"labkit.lab.gitfilter: {repo.resolve()} is not a git work tree; nothing to configure", file=sys.stderr)
        return 0
    if install(repo):
        print("configured the nbstripout git filter: notebook outputs stay on disk, never in git", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
