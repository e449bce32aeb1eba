"""What every energy sampler returns, and the one rule for flagging a too-short window.

A sampler reads a hardware energy *counter* at the start and at the end of a window
and reports the difference. Nothing here averages instantaneous power: a counter
delta is exact for the window, an average of power readings is not.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Protocol


@dataclass
class SourceEnergy:
    """The energy one counter source saw over one window.

    ``energy_j`` is the source total without double counting; ``summed`` names the
    entries of ``components_j`` that make it up (the others, such as RAPL's core
    subzone, are already inside a summed one). ``raw_j`` keeps every channel as read.
    """

    source: str
    energy_j: float
    components_j: dict[str, float]
    summed: list[str]
    update_period_s: float | None
    short_window: bool = False
    notes: list[str] = field(default_factory=list)
    raw_j: dict[str, float] = field(default_factory=dict)

    def as_dict(self) -> dict[str, Any]:
        return {
            "energy_j": self.energy_j,
            "components_j": dict(self.components_j),
            "summed": list(self.summed),
            "raw_j": dict(self.raw_j),
            "update_period_s": self.update_period_s,
            "short_window": self.short_window,
            "notes": list(self.notes),
        }


class Sampler(Protocol):
    """An energy counter: ``snapshot()`` at both ends of a window, then ``delta()``."""

    name: str
    update_period_s: float | None

    def snapshot(self) -> Any: ...

    def delta(self, start: Any, end: Any, *, wall_s: float) -> SourceEnergy: ...

    def describe(self) -> dict[str, Any]: ...

    def close(self) -> None: ...


def short_window_flags(
    *, source: str, wall_s: float, update_period_s: float | None, advanced: bool
) -> tuple[bool, list[str]]:
    """Whether a window is too short for a counter to be trusted, and the notes that say why.

    A counter that updates every ``update_period_s`` can show zero or one whole update
    for a window shorter than that, so the reading may be off by up to 100%.
    A counter that did not move at all is flagged too: real work always costs energy.
    """
    notes = []
    short = False
    if update_period_s is not None and wall_s < update_period_s:
        short = True
        notes.append(
            f"window of {wall_s * 1e3:.1f} ms is shorter than the {source} counter's update "
            f"period (~{update_period_s * 1e3:.0f} ms): the reading can be off by a whole "
            "update; measure a longer window (more tokens) or repeat it"
        )
    if not advanced:
        short = True
        notes.append(f"the {source} counter did not advance during the window")
    return short, notes
