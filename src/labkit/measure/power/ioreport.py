"""Apple silicon energy through IOReport's "Energy Model" group, without root.

The arithmetic is pure Python over delta records ``{"channel", "unit", "value"}``, so
it is tested on recorded data anywhere; only :class:`IOReportSampler` needs macOS
(it reads the counters through ``_macos``'s ctypes binding).

Channel names differ per chip (names as used by macmon and SocPowerBuddy):
  M1/M2:      "CPU Energy", "ECPU", "PCPU", "ECPU0".., "GPU Energy", "GPU", "ANE", "DRAM"
  Pro/Max:    "CPU Energy", "EACC_CPU", "PACC0_CPU", "PACC0_CPU0".., "GPU0", "ANE0", "DRAM0"
  Ultra:      the same with a "DIE_<n>_" prefix, e.g. "DIE_0_CPU Energy"
The same energy appears at several levels (core < cluster < "CPU Energy"), so each
component sums only its highest level present.
"""

from __future__ import annotations

import re
import sys
from collections.abc import Iterable, Mapping
from typing import Any

from labkit.errors import LabkitError
from labkit.measure.power.base import SourceEnergy, short_window_flags

COMPONENTS = ("cpu", "gpu", "ane", "dram")
UNIT_TO_J = {"J": 1.0, "mJ": 1e-3, "uJ": 1e-6, "\u00b5J": 1e-6, "nJ": 1e-9}
_DIE_RE = re.compile(r"^DIE_\d+_")
# (pattern on the name without its die prefix, component, level): level 0 is a
# component total, 1 a cluster, 2 a core; a lower level already contains the higher ones.
_RULES = [
    (re.compile(r"^.*CPU Energy$"), "cpu", 0),
    (re.compile(r"^(ECPU|PCPU|EACC_CPU|PACC\d+_CPU)$"), "cpu", 1),
    (re.compile(r"^(ECPU|PCPU|EACC_CPU|PACC\d+_CPU)\d+$"), "cpu", 2),
    (re.compile(r"^GPU Energy$"), "gpu", 0),
    (re.compile(r"^GPU\d*$"), "gpu", 1),
    (re.compile(r"^ANE"), "ane", 0),
    (re.compile(r"^DRAM"), "dram", 0),
]


def classify(channel: str) -> tuple[str, int] | None:
    """``(component, level)`` for an Energy Model channel, or None if it is none of ours."""
    base = _DIE_RE.sub("", channel)
    for pattern, component, level in _RULES:
        if pattern.match(base):
            return component, level
    return None


def to_joules(value: float, unit: str) -> float:
    """A counter value in IOReport's unit label (mJ, uJ, nJ) as joules."""
    unit = unit.strip()
    if unit not in UNIT_TO_J:
        raise LabkitError(
            f"IOReport reports energy in an unknown unit {unit!r}",
            "report the chip and macOS version so the unit can be added to labkit.measure.power.ioreport",
        )
    return value * UNIT_TO_J[unit]


def ioreport_energy(records: Iterable[Mapping[str, Any]], *, wall_s: float) -> SourceEnergy:
    """Joules per component (cpu, gpu, ane, dram) from one window's IOReport delta records."""
    raw: dict[str, float] = {}
    levels: dict[str, dict[int, list[str]]] = {c: {} for c in COMPONENTS}
    skipped = []
    for rec in records:
        channel, unit, value = rec["channel"], rec["unit"], rec["value"]
        kind = classify(channel)
        if kind is None:
            # Not ours (GPU SRAM, ISP, display...); keep it if its unit is known.
            if unit.strip() in UNIT_TO_J:
                raw[channel] = to_joules(value, unit)
            skipped.append(channel)
            continue
        if value < 0:
            raise LabkitError(f"IOReport delta for {channel!r} is negative ({value} {unit})")
        raw[channel] = raw.get(channel, 0.0) + to_joules(value, unit)
        component, level = kind
        levels[component].setdefault(level, []).append(channel)

    components: dict[str, float] = {}
    notes = []
    for component, by_level in levels.items():
        if not by_level:
            continue
        top = min(by_level)
        components[component] = sum(raw[ch] for ch in by_level[top])
        covered = [ch for lvl, chans in sorted(by_level.items()) if lvl != top for ch in chans]
        if covered:
            notes.append(
                f"{component}: counted {', '.join(by_level[top])}; not added (already inside): "
                + ", ".join(covered)
            )
    if not components:
        raise LabkitError("IOReport's Energy Model group has no CPU, GPU, ANE or DRAM channel")
    if skipped:
        notes.append("not in any component: " + ", ".join(sorted(set(skipped))))
    total = sum(components.values())
    short, flags = short_window_flags(
        source="IOReport", wall_s=wall_s, update_period_s=None, advanced=total > 0
    )
    return SourceEnergy(
        source="ioreport",
        energy_j=total,
        components_j=components,
        summed=list(components),
        update_period_s=None,
        short_window=short,
        notes=flags + notes,
        raw_j=raw,
    )


class IOReportSampler:
    """IOReport's Energy Model counters; each snapshot is one IOReport sample (macOS only)."""

    name = "ioreport"
    # IOReport computes the delta between the two samples we take, so there is no
    # polling period of ours to be shorter than.
    update_period_s = None

    def __init__(self, *, binding: Any = None):
        if binding is None:
            if sys.platform != "darwin":
                raise LabkitError(f"IOReport is macOS-only (this is {sys.platform})")
            from labkit.measure.power import _macos

            binding = _macos.EnergyModelSubscription()
        self._binding = binding

    def snapshot(self) -> Any:
        return self._binding.sample()

    def delta(self, start: Any, end: Any, *, wall_s: float) -> SourceEnergy:
        return ioreport_energy(self._binding.delta_records(start, end), wall_s=wall_s)

    def describe(self) -> dict[str, Any]:
        return {"group": "Energy Model", "components": list(COMPONENTS)}

    def close(self) -> None:
        self._binding.close()
