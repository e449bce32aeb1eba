"""How ``labkit reproduce`` executes one notebook: papermill with limits and progress.

Papermill's own engine runs every cell with one timeout (none by default: one hung
decode blocked a nightly job forever) and says nothing while a 40-minute notebook
runs. This engine, registered with papermill as ``labkit``, adds:

* a per-cell limit (the recipe's ``cell_timeout_s``) and a whole-run deadline, both
  enforced by nbclient's own per-cell timeout (``timeout_func``: each cell gets the
  smaller of its limit and the time left), so a timeout raises ``CellTimeoutError``
  through papermill's normal path and nbclient shuts the kernel down as usual;
* on Ctrl-C or SIGTERM, the kernel interrupted at once (papermill would first save the
  notebook and nbclient then ask a busy kernel to shut down, while the cell went on
  measuring);
* progress on stderr: ``cell i/n`` as each code cell finishes (with the time left by
  the last run here, ``provenance.pace``, and a long cell announced as it starts), and
  every line the notebook prints prefixed with the notebook's name, but for its arm counts
  (the journal watcher says them, with the time) and one line of a per-item counter (a
  prompt at a time) every 15 s. stdout stays for the command's JSON;
* the kernel's sockets encrypted with CurveZMQ where pyzmq supports it (ipykernel 7
  warns on plain TCP, a line per notebook that says nothing of the run).
"""

from __future__ import annotations

import functools
import re
import sys
import time
from collections.abc import Callable

from labkit.provenance import arms as arm_journal

ENGINE = "labkit"


class Limits:
    """The per-cell limit and the absolute deadline (``time.monotonic``) of a reproduction."""

    def __init__(self, cell_s: float | None = None, deadline: float | None = None):
        self.cell_s = cell_s
        self.deadline = deadline

    def for_cell(self) -> float | None:
        """Seconds this cell may take (nbclient treats None as no limit; never return <= 0,
        which it would also read as none)."""
        left = None if self.deadline is None else max(0.01, self.deadline - time.monotonic())
        if self.cell_s is None:
            return left
        return self.cell_s if left is None else min(self.cell_s, left)

    def deadline_passed(self) -> bool:
        return self.deadline is not None and time.monotonic() >= self.deadline - 0.05


# a per-item counter ("k sweep: code-07 T=0.0 run 1/1 (1/2)", "replay: edit-01 (1/40), ..."):
# a line per prompt is a status line (JupyterLab shows it in place), not a log
_ITEM_COUNT = re.compile(r"^(?P<label>[^:()]+): .*\(\d+/\d+\)")
THIN_S = arm_journal.WATCH_EVERY_S  # an item counter is relayed once per label in this long, as the watcher's count


class _Lines:
    """A file-like sink that writes whole lines to stderr, each prefixed with the notebook.

    A terminal is read by a person: ArmBook's counts are left to the journal watcher, and
    of a per-item counter's lines one per label every ``thin_s`` seconds is relayed. The
    executed notebook keeps every line. ``said`` (label -> when) is shared by a notebook's
    stdout and stderr sinks."""

    def __init__(self, prefix: str, said: dict | None = None, *, thin_s: float = THIN_S,
                 clock: Callable[[], float] = time.monotonic):
        self.prefix, self.said, self.thin_s, self.clock = prefix, ({} if said is None else said), thin_s, clock
        self.buf = ""

    def relayed(self, line: str) -> bool:
        # ArmBook's own count: the reproduction's journal watcher says it, with the time
        if arm_journal.PROGRESS_LINE.match(line):
            return False
        m = _ITEM_COUNT.match(line)
        if m is None:
            return True
        now, last = self.clock(), self.said.get(m["label"])
        if last is not None and now - last < self.thin_s:
            return False
        self.said[m["label"]] = now
        return True

    def write(self, text: str) -> None:
        self.buf += text.replace("\r", "\n")
        *lines, self.buf = self.buf.split("\n")
        for line in lines:
            if line.strip() and self.relayed(line.strip()):
                print(f"  {self.prefix}| {line}", file=sys.stderr, flush=True)

    def flush(self) -> None:
        pass


@functools.cache
def register() -> str:
    """Register the engine with papermill (imported here: papermill is slow to import)."""
    from papermill.clientwrap import PapermillNotebookClient
    from papermill.engines import NBClientEngine, papermill_engines

    class _Client(PapermillNotebookClient):
        """Papermill's client, reporting each finished code cell."""

        labkit_progress: Callable | None = None
        labkit_name: str = ""
        labkit_pace = None  # provenance.pace.Pace of the last run here, or None

        def create_kernel_manager(self):
            """The kernel's sockets encrypted (CurveZMQ, keys the manager makes for this kernel
            alone) where pyzmq and the kernelspec support it: ipykernel warns on every start
            over plain TCP, a line per notebook in the terminal that says nothing of the run."""
            from traitlets import TraitError

            km = super().create_kernel_manager()
            try:
                km.transport_encryption = "auto"
            except TraitError:  # pyzmq built without libsodium: plain TCP on 127.0.0.1, as before
                pass
            return km

        def execute_cell(self, cell, cell_index, execution_count=None, store_history=True):
            t0, outcome = time.perf_counter(), "done"
            code = [i for i, c in enumerate(self.nb.cells) if c.cell_type == "code"]
            pace = self.labkit_pace if self.labkit_pace is not None and self.labkit_pace.fits(len(code)) else None
            if cell.cell_type == "code" and self.labkit_progress and pace is not None:
                line = pace.start_line_of(code.index(cell_index), len(code))
                if line:
                    self.labkit_progress(f"{self.labkit_name}: {line}")
            try:
                return super().execute_cell(cell, cell_index, execution_count, store_history)
            except BaseException as e:
                outcome = "failed" if isinstance(e, Exception) else "interrupted"
                if outcome == "interrupted":  # Ctrl-C, SIGTERM: stop the cell before anything else
                    self.labkit_interrupt()
                raise
            finally:
                if cell.cell_type == "code" and self.labkit_progress:
                    i = code.index(cell_index)
                    left = pace.done_suffix(i) if pace is not None and outcome == "done" else ""
                    self.labkit_progress(f"{self.labkit_name}: cell {i + 1}/{len(code)} "
                                         f"{outcome} ({time.perf_counter() - t0:.1f} s){left}")

        def labkit_interrupt(self) -> None:
            """SIGINT to the kernel's process group now: the running cell raises KeyboardInterrupt
            at its next line, so it measures nothing more while papermill saves the notebook and
            nbclient shuts the kernel down (which interrupts it again, then asks it to exit)."""
            from nbclient.util import ensure_async, run_sync

            async def interrupt():
                if self.km is not None and await ensure_async(self.km.is_alive()):
                    await ensure_async(self.km.interrupt_kernel())

            try:
                run_sync(interrupt)()
            except Exception:  # the shutdown that follows still stops it
                pass

    class LabkitEngine(NBClientEngine):
        """Papermill's nbclient engine with ``limits`` and ``progress`` (see the module doc)."""

        @classmethod
        def execute_managed_notebook(cls, nb_man, kernel_name, *, limits: Limits | None = None,
                                     progress: Callable | None = None, name: str = "", pace=None, start_timeout=60,
                                     **_papermill_kwargs):
            from papermill.log import logger

            limits = limits or Limits()
            said: dict = {}
            out, err = (_Lines(name, said), _Lines(name, said)) if progress else (None, None)
            client = _Client(nb_man, kernel_name=kernel_name, startup_timeout=start_timeout, log=logger,
                             timeout_func=lambda cell: limits.for_cell(), stdout_file=out, stderr_file=err)
            client.labkit_progress, client.labkit_name, client.labkit_pace = progress, name, pace
            return client.execute()

    papermill_engines.register(ENGINE, LabkitEngine)
    return ENGINE
