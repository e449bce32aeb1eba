"""Progress of long cells: a live bar in JupyterLab, the current text lines elsewhere.

Under papermill (``labkit reproduce``) and in plain consoles a long measurement reports
with text lines: ``progress=print`` lines on stdout and the arm book's "arms sweep: 3/40 ·
ETA 2m05s" on stderr, which end up in the executed notebook and the log as they are.
In a notebook front end that renders widgets (JupyterLab, VS Code; ``ipywidgets`` is
installed with the kernel) the same reports become one tqdm bar per kind of arm (arms
done / planned, with the arm book's ETA, which counts inherited arms as done) and one
status line that is replaced, not appended: no stderr box, no wall of lines.

``lab.progress`` is the callable notebooks pass as ``progress=``.
"""

from __future__ import annotations

import os

from labkit.provenance.arms import fmt_s


def widgets_frontend(ip) -> bool:
    """Whether output goes to a front end that draws widgets: a Jupyter kernel (not a
    terminal IPython), not papermill's (``LABKIT_RUN_ID``: a reproduction keeps text lines),
    with ipywidgets importable."""
    if ip is None or type(ip).__name__ != "ZMQInteractiveShell" or os.environ.get("LABKIT_RUN_ID"):
        return False
    try:
        import ipywidgets  # noqa: F401
        from tqdm.notebook import tqdm  # noqa: F401
    except ImportError:
        return False
    return True


class Progress:
    """Reports of one session; ``live``: bars and a replaced status line, else text lines."""

    def __init__(self, *, live: bool):
        self.live = live
        self._bars: dict[str, object] = {}
        self._status = None  # the display handle of the status line

    def __call__(self, text: str) -> None:
        """A progress line (``progress=lab.progress``)."""
        if not self.live:
            print(text, flush=True)
            return
        from IPython.display import display

        if self._status is None:
            self._status = display(_Line(text), display_id=True)
        else:
            self._status.update(_Line(text))

    def arms(self, kind: str, done: int, planned: int, eta: float | None) -> None:
        """The arm book's count for ``kind`` (``ArmBook(bar=...)``)."""
        from tqdm.notebook import tqdm

        bar = self._bars.get(kind)
        if bar is None or bar.total != planned and bar.n >= (bar.total or 0):
            bar = self._bars[kind] = tqdm(total=planned, initial=done, desc=f"arms {kind}", unit="arm",
                                          bar_format="{desc}: {n}/{total} {bar} {postfix}")
        bar.total = planned
        bar.n = done
        bar.set_postfix_str(f"ETA {fmt_s(eta)}" if eta is not None and done < planned else
                            ("done" if done >= planned else "ETA after the first arm"), refresh=False)
        bar.refresh()
        if done >= planned:
            bar.close()
            self._bars.pop(kind, None)

    def cell_done(self) -> None:
        """A new cell gets its own status line."""
        self._status = None


class _Line:
    """A status line as plain text (what ``update`` replaces in place)."""

    def __init__(self, text: str):
        self.text = text

    def __repr__(self) -> str:
        return self.text
