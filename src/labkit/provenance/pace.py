"""How long a notebook took last time on this machine: the terminal's "about 12m00s left".

``labkit reproduce`` runs 02 for a quarter of an hour on a 2-core box, and the arms' ETA
covers one search round at a time (the search plans its rounds one by one). The newest
finished run of the same notebook and effective recipe on the same machine (host label
and CPU, as ``runtags.machine_of`` tells boxes apart) logged its executed notebook, and
papermill wrote each cell's duration into it: from those, the time left after each cell,
and what a long cell took before it starts; for a reproduction of several notebooks, what
the last one of the same notebooks took in all. No such run, or a notebook whose code
cells changed in number since: no estimate, never a guess.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

from labkit.provenance import tracking
from labkit.provenance.arms import fmt_s

LONG_CELL_S = 60.0  # a cell that took this long last time is announced as it starts


@dataclass(frozen=True)
class Pace:
    """Per code cell, in order (papermill's injected parameters cell included), the seconds
    it took in the run ``source`` (a LAB ID); None where papermill recorded none."""

    source: str
    cells: tuple[float | None, ...]

    @property
    def total(self) -> float:
        return sum(s for s in self.cells if s is not None)

    def left_after(self, i: int) -> float:
        """Seconds the code cells after the ``i``-th (0-based) took then."""
        return sum(s for s in self.cells[i + 1:] if s is not None)

    def took(self, i: int) -> float | None:
        return self.cells[i] if 0 <= i < len(self.cells) else None

    def fits(self, n_code_cells: int) -> bool:
        """The same number of code cells: cell i then is cell i now."""
        return len(self.cells) == n_code_cells

    def start_line(self) -> str:
        return f"last time here its cells took {fmt_s(self.total)} [{self.source}]"

    def done_suffix(self, i: int) -> str:
        left = self.left_after(i)
        return f" · about {fmt_s(left)} left" if left >= 1 else ""

    def start_line_of(self, i: int, n: int) -> str | None:
        took = self.took(i)
        if took is None or took < LONG_CELL_S:
            return None
        return f"cell {i + 1}/{n} running; it took {fmt_s(took)} in [{self.source}]"


def cell_durations(nb: dict) -> tuple[float | None, ...]:
    """Each code cell's ``metadata.papermill.duration`` of an executed notebook (JSON)."""
    out = []
    for cell in nb.get("cells", []):
        if cell.get("cell_type") != "code":
            continue
        d = (cell.get("metadata") or {}).get("papermill", {}).get("duration")
        out.append(float(d) if isinstance(d, int | float) else None)
    return tuple(out)


def _same_machine(a: dict, b: dict) -> bool:
    """Host label and CPU (the engine build is known only once the notebook opens it)."""
    def key(t):
        return t.get("host.label") or t.get("host.name"), t.get("host.cpu_id")

    return key(a) == key(b)


def _newest_finished(c, run_id: str, tag: str) -> tuple[object | None, list]:
    """The run, and the newest finished runs (20 at most) of its experiment whose ``tag``
    has its value; (None, []) when it has no such tag, or the store is slow or away (the
    run goes on without an estimate)."""
    try:
        this = c.get_run(run_id)
        value = this.data.tags.get(tag)
        if not value:
            return None, []
        return this, c.search_runs([this.info.experiment_id],
                                   filter_string=f"tags.`{tag}` = '{value}' and attributes.status = 'FINISHED'",
                                   order_by=["attributes.start_time DESC"], max_results=20)
    except Exception:
        return None, []


def previous(c, run_id: str, notebook: str) -> Pace | None:
    """The pace of the newest finished run of ``notebook`` that ``labkit reproduce`` started
    with the same effective recipe and parameters as ``run_id`` (``recipe.reproduce_hash``:
    a downstream notebook's session later sets ``recipe.effective_hash`` with the 02 run it
    read), on its machine, and not a resumed run (its cells measured only what the
    interrupted one had not); None when there is none or its notebook cannot be read."""
    this, runs = _newest_finished(c, run_id, "recipe.reproduce_hash")
    for r in runs:
        if r.info.run_id == run_id or r.data.tags.get("resume.from") or not _same_machine(r.data.tags, this.data.tags):
            continue
        try:
            nb = json.loads(tracking.read_artifact(c, r.info.run_id, f"notebook/{notebook}.ipynb"))
        except Exception:  # its notebook was not logged (a store that failed mid-run): no estimate
            return None
        cells = cell_durations(nb)
        return Pace(r.data.tags.get("lab.id", r.info.run_id), cells) if any(cells) else None
    return None


def previous_reproduction(c, parent_id: str) -> tuple[float, str] | None:
    """Seconds the newest finished ``labkit reproduce`` of the same notebooks and recipe on
    this machine took, start to close, and its output folder; None when there is none."""
    this, runs = _newest_finished(c, parent_id, "recipe.effective_hash")
    for r in runs:
        if (r.info.run_id != parent_id and r.data.tags.get("lab.notebooks") == this.data.tags.get("lab.notebooks")
                and _same_machine(r.data.tags, this.data.tags) and r.info.end_time and r.info.start_time):
            return (r.info.end_time - r.info.start_time) / 1000, r.data.tags.get("lab.output", r.info.run_id)
    return None
