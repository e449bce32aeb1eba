"""Energy per token from hardware counters: RAPL (Linux), IOReport (Apple silicon), NVML.

Every figure is a counter delta over a measured window; nothing is estimated. Where no
counter exists the result says so, with the reason::

    from labkit import power
    with power.measure() as w:
        run_decode()
    costs = power.per_token(w.result, tokens=n)

``w.result`` keys: ``wall_s``, ``cpu_process_s``, ``cpu_children_s``, ``cpu_system_s``
(None off Linux), ``cpu_count``, ``energy_available``, ``energy_j`` (sum over sources,
or None), ``energy_sources`` (name -> ``energy_j``, ``components_j``, ``summed``,
``raw_j``, ``update_period_s``, ``short_window``, ``notes``), ``energy_unavailable``
(name -> reason), ``energy_reason``, ``short_window``, ``notes``.
"""

from __future__ import annotations

from labkit.measure.power.base import Sampler, SourceEnergy
from labkit.measure.power.ioreport import IOReportSampler, ioreport_energy
from labkit.measure.power.nvml import NvmlReader, NvmlSampler, nvml_energy
from labkit.measure.power.rapl import (
    DEFAULT_POWERCAP_ROOT,
    RaplSampler,
    counter_delta,
    find_zones,
    rapl_energy,
)
from labkit.measure.power.window import SOURCES, Window, discover, measure, open_sampler, per_token

__all__ = [
    "DEFAULT_POWERCAP_ROOT",
    "SOURCES",
    "IOReportSampler",
    "NvmlReader",
    "NvmlSampler",
    "RaplSampler",
    "Sampler",
    "SourceEnergy",
    "Window",
    "counter_delta",
    "discover",
    "find_zones",
    "ioreport_energy",
    "measure",
    "nvml_energy",
    "open_sampler",
    "per_token",
    "rapl_energy",
]
