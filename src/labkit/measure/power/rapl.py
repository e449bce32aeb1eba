"""Linux RAPL energy counters through ``/sys/class/powercap`` (Intel, and AMD Zen).

Each ``intel-rapl:N`` zone is a socket package; ``intel-rapl:N:M`` subzones are its
``core``, ``uncore`` and ``dram`` domains; a top-level ``psys`` zone is the whole
platform. ``energy_uj`` counts up in microjoules and wraps at ``max_energy_range_uj``.
"""

from __future__ import annotations

import errno
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from labkit.errors import LabkitError
from labkit.measure.power.base import SourceEnergy, short_window_flags

DEFAULT_POWERCAP_ROOT = Path("/sys/class/powercap")
# RAPL counters refresh about every millisecond (Intel SDM vol. 3B, "RAPL interfaces").
RAPL_UPDATE_PERIOD_S = 0.001
PERMISSION_FIX = (
    "sudo chmod o+r /sys/class/powercap/intel-rapl:*/energy_uj "
    "/sys/class/powercap/intel-rapl:*:*/energy_uj (until reboot), or run as root"
)
# "intel-rapl:0" and "intel-rapl:0:1", but not "intel-rapl-mmio:0": the MMIO zone is a
# second view of the same package counter, and summing both would count it twice.
_ZONE_RE = re.compile(r"^intel-rapl:(\d+)(?::(\d+))?$")


@dataclass(frozen=True)
class Zone:
    """One powercap zone: ``key`` is the sysfs directory, ``label`` the name we report."""

    key: str
    name: str
    label: str
    path: Path
    max_range_uj: int
    parent: str | None

    @property
    def summed(self) -> bool:
        # The PKG domain covers cores and uncore but not DRAM, so a package total is
        # package + dram. psys already contains the package: reported, never added.
        # Some platforms list dram as a top-level zone rather than a package subzone.
        return self.name == "dram" or (self.parent is None and self.name.startswith("package"))


def _read_text(path: Path) -> str:
    return path.read_text()


def read_counter(path: Path) -> int:
    """An integer sysfs file; EACCES becomes an error that says how to grant access."""
    try:
        return int(_read_text(path).strip())
    except PermissionError as exc:
        raise LabkitError(
            f"cannot read {path}: permission denied (since the 2020 PLATYPUS fix, "
            "CVE-2020-8694, kernels make RAPL energy counters readable by root only)",
            PERMISSION_FIX,
        ) from exc
    except OSError as exc:
        if exc.errno == errno.EACCES:
            raise LabkitError(f"cannot read {path}: permission denied", PERMISSION_FIX) from exc
        raise LabkitError(f"cannot read {path}: {exc.strerror or exc}") from exc
    except ValueError as exc:
        raise LabkitError(f"{path} does not hold an integer counter") from exc


def _sort_key(key: str) -> tuple[int, int]:
    m = _ZONE_RE.match(key)
    assert m is not None
    return int(m.group(1)), -1 if m.group(2) is None else int(m.group(2))


def find_zones(*, root: Path = DEFAULT_POWERCAP_ROOT) -> list[Zone]:
    """Every RAPL zone under ``root``, parents first; raises with the reason if there are none."""
    root = Path(root)
    if not root.is_dir():
        raise LabkitError(f"no {root} on this machine (Linux RAPL not exposed)")
    keys = sorted((p.name for p in root.iterdir() if _ZONE_RE.match(p.name)), key=_sort_key)
    if not keys:
        raise LabkitError(
            f"no intel-rapl zones under {root} (the CPU has no RAPL or its driver is not loaded)",
            "sudo modprobe intel_rapl_msr",
        )
    try:
        names = {k: _read_text(root / k / "name").strip() for k in keys}
    except OSError as exc:
        raise LabkitError(f"cannot read a RAPL zone name under {root}: {exc}") from exc
    zones = []
    for key in keys:
        parent = key.rsplit(":", 1)[0] if key.count(":") == 2 else None
        label = names[key] if parent is None else f"{names[parent]}/{names[key]}"
        if any(z.label == label for z in zones):  # two top-level zones with one name
            label = f"{label}[{key}]"
        zones.append(
            Zone(
                key=key,
                name=names[key],
                label=label,
                path=root / key,
                max_range_uj=read_counter(root / key / "max_energy_range_uj"),
                parent=parent,
            )
        )
    return zones


def counter_delta(start_uj: int, end_uj: int, *, max_range_uj: int) -> int:
    """Microjoules between two reads, adding one wrap when the counter went backwards.

    More than one wrap in a window cannot be seen; at 200 W a 262 kJ range wraps
    every ~22 minutes, so keep windows shorter than that.
    """
    delta = end_uj - start_uj
    if delta < 0:
        delta += max_range_uj
    return delta


def rapl_energy(
    zones: list[Zone], start: dict[str, int], end: dict[str, int], *, wall_s: float
) -> SourceEnergy:
    """Joules per zone from two snapshots (``zone key -> energy_uj``); total = packages + dram."""
    components = {
        z.label: counter_delta(start[z.key], end[z.key], max_range_uj=z.max_range_uj) / 1e6
        for z in zones
    }
    summed = [z.label for z in zones if z.summed]
    if not summed:
        raise LabkitError("no RAPL package zone to total (only " + ", ".join(components) + ")")
    total = sum(components[label] for label in summed)
    short, notes = short_window_flags(
        source="RAPL", wall_s=wall_s, update_period_s=RAPL_UPDATE_PERIOD_S, advanced=total > 0
    )
    return SourceEnergy(
        source="rapl",
        energy_j=total,
        components_j=components,
        summed=summed,
        update_period_s=RAPL_UPDATE_PERIOD_S,
        short_window=short,
        notes=notes,
    )


class RaplSampler:
    """Reads every RAPL zone's ``energy_uj``; opening it already proves the counters are readable."""

    name = "rapl"
    update_period_s = RAPL_UPDATE_PERIOD_S

    def __init__(self, *, root: Path = DEFAULT_POWERCAP_ROOT):
        self.root = Path(root)
        self.zones = find_zones(root=self.root)
        self.snapshot()  # fail now, with the chmod fix, rather than at the window's end

    def snapshot(self) -> dict[str, int]:
        return {z.key: read_counter(z.path / "energy_uj") for z in self.zones}

    def delta(self, start: dict[str, int], end: dict[str, int], *, wall_s: float) -> SourceEnergy:
        return rapl_energy(self.zones, start, end, wall_s=wall_s)

    def describe(self) -> dict[str, Any]:
        return {
            "root": str(self.root),
            "zones": {z.key: z.label for z in self.zones},
            "summed": [z.label for z in self.zones if z.summed],
            "update_period_s": self.update_period_s,
        }

    def close(self) -> None:
        pass
