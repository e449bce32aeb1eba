"""NVIDIA GPU energy from NVML's total-energy counter (millijoules since the driver loaded).

``nvmlDeviceGetTotalEnergyConsumption`` exists on Volta and newer. The reader is a thin
shell over the ``pynvml`` module (package ``nvidia-ml-py``, imported lazily and
injectable for tests); :func:`nvml_energy` is the arithmetic.
"""

from __future__ import annotations

import importlib
from collections.abc import Mapping
from typing import Any

from labkit.errors import LabkitError, missing_extra
from labkit.measure.power.base import SourceEnergy, short_window_flags

# The counter is refreshed by the driver every ~20-100 ms depending on the GPU;
# take the slow end so a window is only trusted when it spans at least one update.
NVML_UPDATE_PERIOD_S = 0.1


def import_pynvml() -> Any:
    """The ``pynvml`` module from ``nvidia-ml-py``, or the error naming the extra."""
    try:
        return importlib.import_module("pynvml")
    except ImportError as exc:
        raise missing_extra("pynvml", "nvml") from exc


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


class NvmlReader:
    """Every GPU whose total-energy counter can be read: ``read_mj()`` returns ``{"gpu0": mJ}``."""

    def __init__(self, *, nvml: Any = None):
        self._nvml = nvml = import_pynvml() if nvml is None else nvml
        try:
            nvml.nvmlInit()
        except nvml.NVMLError as exc:
            raise LabkitError(f"no NVIDIA GPU (NVML: {exc})") from exc
        self._handles: dict[str, Any] = {}
        self.names: dict[str, str] = {}
        self.skipped: dict[str, str] = {}
        try:
            for i in range(nvml.nvmlDeviceGetCount()):
                handle = nvml.nvmlDeviceGetHandleByIndex(i)
                label, name = f"gpu{i}", _text(nvml.nvmlDeviceGetName(handle))
                try:
                    nvml.nvmlDeviceGetTotalEnergyConsumption(handle)
                except nvml.NVMLError as exc:  # pre-Volta GPUs: Not Supported
                    self.skipped[label] = f"{name}: {exc}"
                    continue
                self._handles[label] = handle
                self.names[label] = name
        except nvml.NVMLError as exc:
            self.close()
            raise LabkitError(f"NVML could not list the GPUs: {exc}") from exc
        if not self._handles:
            self.close()
            why = "; ".join(f"{k} {v}" for k, v in self.skipped.items()) or "no devices"
            raise LabkitError(f"no NVIDIA GPU with a total-energy counter (NVML: {why})")

    def read_mj(self) -> dict[str, int]:
        nvml = self._nvml
        try:
            return {
                label: int(nvml.nvmlDeviceGetTotalEnergyConsumption(handle))
                for label, handle in self._handles.items()
            }
        except nvml.NVMLError as exc:
            raise LabkitError(f"NVML energy read failed: {exc}") from exc

    def close(self) -> None:
        if self._nvml is not None:
            try:
                self._nvml.nvmlShutdown()
            except self._nvml.NVMLError:
                pass  # already shut down: nothing left to free
            self._nvml = None


def nvml_energy(
    start: Mapping[str, int],
    end: Mapping[str, int],
    *,
    wall_s: float,
    update_period_s: float = NVML_UPDATE_PERIOD_S,
) -> SourceEnergy:
    """Joules per GPU from two counter reads (``label -> mJ``).

    The counter is 64-bit and starts at driver load, so it does not wrap: one that
    went backwards means the driver was reloaded or the GPU reset mid-window, and
    no honest number exists for that window.
    """
    components = {}
    for label, s in start.items():
        e = end[label]
        if e < s:
            raise LabkitError(
                f"NVML energy counter of {label} went backwards ({s} -> {e} mJ): the driver "
                "was reloaded or the GPU reset during the window",
                "measure again; keep the driver loaded between runs (nvidia-persistenced)",
            )
        components[label] = (e - s) / 1e3
    total = sum(components.values())
    short, notes = short_window_flags(
        source="NVML", wall_s=wall_s, update_period_s=update_period_s, advanced=total > 0
    )
    return SourceEnergy(
        source="nvml",
        energy_j=total,
        components_j=components,
        summed=list(components),
        update_period_s=update_period_s,
        short_window=short,
        notes=notes,
    )


class NvmlSampler:
    """NVML total energy of every capable GPU (board energy, as the driver accounts it)."""

    name = "nvml"
    update_period_s = NVML_UPDATE_PERIOD_S

    def __init__(self, *, nvml: Any = None, reader: Any = None):
        self._reader = NvmlReader(nvml=nvml) if reader is None else reader

    def snapshot(self) -> dict[str, int]:
        return self._reader.read_mj()

    def delta(self, start: dict[str, int], end: dict[str, int], *, wall_s: float) -> SourceEnergy:
        return nvml_energy(start, end, wall_s=wall_s, update_period_s=self.update_period_s)

    def describe(self) -> dict[str, Any]:
        return {
            "devices": dict(getattr(self._reader, "names", {})),
            "skipped": dict(getattr(self._reader, "skipped", {})),
            "update_period_s": self.update_period_s,
        }

    def close(self) -> None:
        self._reader.close()
