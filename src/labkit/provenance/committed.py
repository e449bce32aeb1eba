"""Does a reproduction run the notebooks as committed?

JupyterLab's autosave rewrites the tracked notebooks: after an interactive run with tiny
parameters, ``02_k_sweep.ipynb`` held outputs and its paired ``.py`` the tiny values, and
the next ``labkit reproduce`` silently ran the tiny sweep under the name "default". So a
reproduction first asks git whether each notebook, and its jupytext pair, is exactly what
HEAD holds. If not it refuses, naming the files, unless told ``--allow-dirty``; the run
then records that it ran uncommitted notebooks and which (``lab.allow_dirty``,
``lab.dirty_files``), so nobody mistakes it for a reproduction of the commit.

A notebook outside any git work tree (a scratch folder, ``$LABKIT_NOTEBOOKS``) has no
committed version to compare with; its runs are tagged ``lab.notebook_git = none``.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

from labkit.errors import LabkitError


def _git(cwd: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(["git", "-C", str(cwd), *args], capture_output=True, text=True, timeout=60)


def changed_files(nb: Path) -> list[str] | None:
    """The notebook's files (``.ipynb`` and its paired ``.py``) that differ from HEAD or are
    not committed, relative to the repository; None when the notebook is not in a git work tree."""
    try:
        top = _git(nb.parent, "rev-parse", "--show-toplevel")
    except (OSError, subprocess.SubprocessError):
        return None
    if top.returncode != 0:
        return None
    root = Path(top.stdout.strip())
    files = [p for p in (nb, nb.with_suffix(".py")) if p.exists()]
    rel = [str(p.resolve().relative_to(root.resolve())) for p in files]
    # porcelain lists staged, unstaged and untracked changes alike (ignored files are not listed:
    # an ignored notebook has no committed version either, so check that separately)
    st = _git(root, "status", "--porcelain", "--untracked-files=all", "--", *rel)
    if st.returncode != 0:
        raise LabkitError(f"git status failed in {root}: {st.stderr.strip()[:300]}",
                          "check the checkout (`git status`), or pass --allow-dirty")
    dirty = sorted({line[3:].strip() for line in st.stdout.splitlines() if line.strip()})
    tracked = _git(root, "ls-files", "--error-unmatch", "--", rel[0])
    if tracked.returncode != 0 and rel[0] not in dirty:
        dirty.insert(0, rel[0])
    return dirty


def check(nbs: list[Path], *, allow_dirty: bool = False) -> dict[Path, dict]:
    """Per notebook, the run tags saying what was run; refuses uncommitted notebooks
    unless ``allow_dirty``."""
    tags, bad = {}, []
    for nb in nbs:
        changed = changed_files(nb)
        if changed is None:
            tags[nb] = {"lab.notebook_git": "none", "lab.allow_dirty": str(allow_dirty).lower()}
        elif not changed:
            tags[nb] = {"lab.notebook_git": "committed", "lab.allow_dirty": str(allow_dirty).lower()}
        else:
            bad += changed
            tags[nb] = {"lab.notebook_git": "uncommitted", "lab.allow_dirty": "true",
                        "lab.dirty_files": ", ".join(changed)}
    if bad and not allow_dirty:
        raise LabkitError(
            f"the notebook files {', '.join(bad)} differ from the commit (HEAD): a reproduction runs the "
            "notebooks as committed",
            "commit the change (after `jupytext --sync`), or undo it with `git checkout -- FILE`; or pass "
            "--allow-dirty to run them as they are (the run records it)",
        )
    return tags
