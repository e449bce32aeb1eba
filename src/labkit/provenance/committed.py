"""Does a reproduction run the notebooks as committed?

JupyterLab saves what its user did: an interactive run of ``02_k_sweep`` with tiny
parameters leaves those values in the ``.ipynb`` and its paired ``.py``, and once the next
``labkit reproduce`` silently ran the tiny sweep under the name "default". So a
reproduction first asks git whether each notebook, and its jupytext pair, is exactly what
HEAD holds. If not it refuses, naming the files, unless told ``--allow-dirty``; the run
then records that it ran uncommitted notebooks and which (``lab.allow_dirty``,
``lab.dirty_files``), so nobody mistakes it for a reproduction of the commit.

Outputs are not a change: a saved notebook keeps its figures and tables on disk, and git
reads notebooks through the ``nbstripout`` clean filter (``.gitattributes``; configured by
``scripts/setup.sh``), so ``git status`` sees sources only. Papermill clears every output
before it executes, so what runs is the committed sources. In a clone where the filter is
not configured, a notebook with outputs reads as changed and the refusal says to run
``make setup``.

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
    # git status reports a file whose size changed without reading it through the clean
    # filter (a notebook saved with outputs): such a file is unchanged when its filtered
    # content is HEAD's
    dirty = [f for f in dirty if not _same_as_head(root, f)]
    tracked = _git(root, "ls-files", "--error-unmatch", "--", rel[0])
    if tracked.returncode != 0 and rel[0] not in dirty:
        dirty.insert(0, rel[0])
    return dirty


def _same_as_head(root: Path, rel: str) -> bool:
    if not (root / rel).is_file():
        return False
    head = _git(root, "rev-parse", "-q", "--verify", f"HEAD:{rel}")
    now = _git(root, "hash-object", "--path", rel, "--", rel)  # through the file's filters
    return head.returncode == 0 and now.returncode == 0 and head.stdout.strip() == now.stdout.strip()


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
        unfiltered = _filter_missing(nbs[0]) if nbs else False
        raise LabkitError(
            f"the notebook files {', '.join(bad)} differ from the commit (HEAD): a reproduction runs the "
            "notebooks as committed"
            + (" (and this clone has no nbstripout git filter, so saved outputs count as changes)"
               if unfiltered else ""),
            ("run `make setup` (it configures the filter), then " if unfiltered else "")
            + "commit the change (after `jupytext --sync`), or undo it with `git checkout -- FILE`; or pass "
            "--allow-dirty to run them as they are (the run records it)",
        )
    return tags


def _filter_missing(nb: Path) -> bool:
    """Whether git would read ``nb`` through the nbstripout filter but the filter is not configured."""
    try:
        attr = _git(nb.parent, "check-attr", "filter", "--", nb.name)
        conf = _git(nb.parent, "config", "--get", "filter.nbstripout.clean")
    except (OSError, subprocess.SubprocessError):
        return False
    return attr.stdout.strip().endswith(": nbstripout") and conf.returncode != 0
