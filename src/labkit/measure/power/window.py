"""Measure one window: snapshot every available counter at its start and end.

``measure()`` opens the samplers this machine has (RAPL, IOReport, NVML) before the
window, so opening costs nothing inside it; a source that is missing is reported
with its reason, never estimated. ``discover()`` says the same without measuring.
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from labkit.errors import LabkitError
from labkit.measure.power import cputime
from labkit.measure.power.base import Sampler, SourceEnergy
from labkit.measure.power.ioreport import IOReportSampler
from labkit.measure.power.nvml import NvmlSampler
from labkit.measure.power.rapl import DEFAULT_POWERCAP_ROOT, RaplSampler

SOURCES = ("rapl", "ioreport", "nvml")


def open_sampler(
    name: str, *, powercap_root: Path = DEFAULT_POWERCAP_ROOT, nvml: Any = None
) -> Sampler:
    """One sampler by name; raises :class:`LabkitError` saying why it is unavailable here."""
    if name == "rapl":
        return RaplSampler(root=powercap_root)
    if name == "ioreport":
        return IOReportSampler()
    if name == "nvml":
        return NvmlSampler(nvml=nvml)
    raise LabkitError(f"unknown energy source {name!r}", f"use one of {', '.join(SOURCES)}")


def _reason(exc: LabkitError) -> str:
    return exc.problem if exc.fix is None else f"{exc.problem} (fix: {exc.fix})"


class Window:
    """A measured window: ``with measure() as w: ...`` then read ``w.result`` (a dict).

    Energy counters are read outside the CPU clocks at both ends, so the energy
    window contains the timed one; the difference is a few counter reads.
    """

    def __init__(
        self,
        *,
        samplers: Sequence[Sampler],
        unavailable: Mapping[str, LabkitError] | None = None,
        require: Iterable[str] = (),
        proc_stat: Path = cputime.PROC_STAT,
    ):
        self.samplers = list(samplers)
        self.unavailable = dict(unavailable or {})
        self.require = set(require)
        self.proc_stat = proc_stat
        self.result: dict[str, Any] | None = None
        self._starts: dict[str, Any] = {}

    def start(self) -> Window:
        for s in list(self.samplers):
            try:
                self._starts[s.name] = s.snapshot()
            except LabkitError as exc:
                if s.name in self.require:
                    raise
                self._drop(s, exc)
        self._cpu0 = cputime.snapshot(proc_stat=self.proc_stat)
        self._t0 = time.perf_counter()
        return self

    def stop(self) -> dict[str, Any]:
        """End the window and return the result (also kept as ``self.result``)."""
        wall_s = time.perf_counter() - self._t0
        cpu1 = cputime.snapshot(proc_stat=self.proc_stat)
        sources: dict[str, SourceEnergy] = {}
        try:
            ends = {}
            for s in reversed(list(self.samplers)):
                try:
                    ends[s.name] = s.snapshot()
                except LabkitError as exc:
                    if s.name in self.require:
                        raise
                    self._drop(s, exc)
            for s in list(self.samplers):
                try:
                    sources[s.name] = s.delta(self._starts[s.name], ends[s.name], wall_s=wall_s)
                except LabkitError as exc:
                    if s.name in self.require:
                        raise
                    self._drop(s, exc)
        finally:
            self.close()
        self.result = build_result(
            wall_s=wall_s,
            cpu=cputime.cpu_delta(self._cpu0, cpu1),
            sources=sources,
            unavailable=self.unavailable,
        )
        return self.result

    def _drop(self, sampler: Sampler, exc: LabkitError) -> None:
        self.samplers.remove(sampler)
        self.unavailable[sampler.name] = exc
        sampler.close()

    def close(self) -> None:
        for s in self.samplers:
            s.close()

    def __enter__(self) -> Window:
        return self.start()

    def __exit__(self, exc_type, exc, tb) -> bool:
        if exc_type is None:
            self.stop()
        else:
            self.close()  # a failed window has no honest result
        return False


def build_result(
    *,
    wall_s: float,
    cpu: Mapping[str, float | None],
    sources: Mapping[str, SourceEnergy],
    unavailable: Mapping[str, LabkitError],
) -> dict[str, Any]:
    """The JSON-ready result of one window (keys documented in ``labkit.measure.power``)."""
    notes = [f"{name}: {n}" for name, src in sources.items() for n in src.notes]
    if cpu["cpu_system_s"] is None:
        notes.append("cpu_system_s needs /proc/stat (Linux); not measured here")
    reasons = {name: _reason(exc) for name, exc in unavailable.items()}
    return {
        "wall_s": wall_s,
        **cpu,
        "cpu_count": os.cpu_count(),
        "energy_available": bool(sources),
        "energy_j": sum(s.energy_j for s in sources.values()) if sources else None,
        "energy_sources": {name: s.as_dict() for name, s in sources.items()},
        "energy_unavailable": reasons,
        "energy_reason": "; ".join(f"{k}: {v}" for k, v in reasons.items())
        or (None if sources else "no energy source was asked for"),
        "short_window": any(s.short_window for s in sources.values()),
        "notes": notes,
    }


def measure(
    *,
    sources: Iterable[str] = SOURCES,
    require: Iterable[str] = (),
    powercap_root: Path = DEFAULT_POWERCAP_ROOT,
    nvml: Any = None,
    samplers: Sequence[Sampler] | None = None,
    proc_stat: Path = cputime.PROC_STAT,
) -> Window:
    """A window over every available energy source (or the given ``samplers``).

    ``require`` names sources that must work: if one is unavailable, the error with
    its fix is raised instead of being recorded as a reason.
    """
    require = tuple(require)
    unavailable: dict[str, LabkitError] = {}
    if samplers is None:
        samplers = []
        for name in sources:
            try:
                samplers.append(open_sampler(name, powercap_root=powercap_root, nvml=nvml))
            except LabkitError as exc:
                unavailable[name] = exc
    for name in require:
        if name in unavailable:
            for s in samplers:
                s.close()
            exc = unavailable[name]
            raise LabkitError(
                f"required energy source {name} is unavailable: {exc.problem}", exc.fix
            )
    return Window(samplers=samplers, unavailable=unavailable, require=require, proc_stat=proc_stat)


def discover(
    *,
    sources: Iterable[str] = SOURCES,
    powercap_root: Path = DEFAULT_POWERCAP_ROOT,
    nvml: Any = None,
    proc_stat: Path = cputime.PROC_STAT,
) -> dict[str, dict[str, Any]]:
    """Which counters this machine has, and for each missing one the reason and fix."""
    out: dict[str, dict[str, Any]] = {}
    for name in sources:
        try:
            sampler = open_sampler(name, powercap_root=powercap_root, nvml=nvml)
        except LabkitError as exc:
            out[name] = {"available": False, "reason": exc.problem, "fix": exc.fix}
            continue
        try:
            out[name] = {"available": True, **sampler.describe()}
        finally:
            sampler.close()
    out["cpu_process"] = {"available": True, "clock": "time.process_time (user+sys, all threads)"}
    busy = cputime.read_system_busy_ticks(path=proc_stat)
    out["cpu_system"] = (
        {"available": True, "source": str(proc_stat)}
        if busy is not None
        else {"available": False, "reason": f"no {proc_stat} (system-wide CPU time is Linux-only)"}
    )
    return out


def per_token(result: Mapping[str, Any], tokens: int) -> dict[str, Any]:
    """Costs per generated token from a window's result; energy figures are None without energy."""
    if tokens <= 0:
        raise ValueError(f"tokens must be positive, got {tokens}")
    wall, energy = result["wall_s"], result["energy_j"]
    system = result.get("cpu_system_s")
    return {
        "tokens": tokens,
        "j_per_token": None if energy is None else energy / tokens,
        "j_per_token_by_source": {
            name: src["energy_j"] / tokens for name, src in result["energy_sources"].items()
        },
        "cpu_s_per_token": result["cpu_process_s"] / tokens,
        "cpu_system_s_per_token": None if system is None else system / tokens,
        "tokens_per_s": tokens / wall if wall > 0 else None,
        "mean_power_w": energy / wall if energy is not None and wall > 0 else None,
        "short_window": result["short_window"],
    }
