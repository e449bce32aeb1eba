"""labkit.measure.power: counter arithmetic on recorded fixtures, and the live CPU-time path.

RAPL runs on a fake powercap tree built in tmp_path, IOReport on recorded delta
records, NVML through a fake ``pynvml`` module; only CPU time is measured for real.
"""

from __future__ import annotations

import errno
import json
import os
import time
from pathlib import Path
from types import SimpleNamespace

import pytest

from labkit.errors import LabkitError
from labkit.measure import power
from labkit.measure.power import cputime, ioreport, nvml, rapl

FIXTURES = Path(__file__).parent / "fixtures" / "power"


def load(name: str) -> dict:
    return json.loads((FIXTURES / name).read_text())


# -- RAPL -------------------------------------------------------------------------------


def make_powercap(root: Path, *, at: str = "start") -> dict:
    """Lay out rapl_tree.json as sysfs does; ``at`` picks the energy_uj values written."""
    tree = load("rapl_tree.json")["zones"]
    (root / "intel-rapl").mkdir(parents=True)  # the control-type directory: not a zone
    (root / "intel-rapl" / "enabled").write_text("1\n")
    for key, z in tree.items():
        d = root / key
        d.mkdir()
        (d / "name").write_text(z["name"] + "\n")
        (d / "max_energy_range_uj").write_text(f"{z['max_energy_range_uj']}\n")
        (d / "energy_uj").write_text(f"{z[at]}\n")
    return tree


def set_counters(root: Path, tree: dict, at: str) -> None:
    for key, z in tree.items():
        (root / key / "energy_uj").write_text(f"{z[at]}\n")


def test_find_zones_reads_tree_and_skips_mmio_and_control_dir(tmp_path):
    make_powercap(tmp_path)
    zones = rapl.find_zones(root=tmp_path)
    assert [z.key for z in zones] == [
        "intel-rapl:0", "intel-rapl:0:0", "intel-rapl:0:1", "intel-rapl:0:2",
        "intel-rapl:1", "intel-rapl:1:0", "intel-rapl:1:1", "intel-rapl:2",
    ]  # fmt: skip
    labels = {z.key: z.label for z in zones}
    assert labels["intel-rapl:1:1"] == "package-1/dram"
    assert labels["intel-rapl:2"] == "psys"
    assert [z.label for z in zones if z.summed] == [
        "package-0", "package-0/dram", "package-1", "package-1/dram",
    ]  # fmt: skip


def test_counter_delta_adds_one_range_when_the_counter_wraps():
    assert rapl.counter_delta(100, 250, max_range_uj=1000) == 150
    assert rapl.counter_delta(900, 50, max_range_uj=1000) == 150
    assert rapl.counter_delta(7, 7, max_range_uj=1000) == 0


def test_rapl_window_sums_packages_and_dram_once_and_handles_wrap(tmp_path):
    tree = make_powercap(tmp_path)
    with power.measure(sources=["rapl"], powercap_root=tmp_path, require=["rapl"]) as w:
        set_counters(tmp_path, tree, "end")
        time.sleep(0.01)
    src = w.result["energy_sources"]["rapl"]
    comp = src["components_j"]
    assert comp["package-0"] == pytest.approx(45.0)
    assert comp["package-0/core"] == pytest.approx(30.0)
    assert comp["package-0/uncore"] == pytest.approx(1.0)
    assert comp["package-0/dram"] == pytest.approx(6.0)
    # package-1 and its dram both wrapped: 262143328850 - 262140000000 + 38671150 uJ.
    assert comp["package-1"] == pytest.approx(42.0)
    assert comp["package-1/dram"] == pytest.approx(5.0)
    assert comp["psys"] == pytest.approx(120.0)
    assert len(comp) == 8  # the MMIO duplicate of package-0 is not a zone of ours
    # packages + dram; core/uncore are inside the package and psys contains it all.
    assert src["energy_j"] == pytest.approx(45 + 6 + 42 + 5)
    assert w.result["energy_j"] == pytest.approx(98.0)
    assert w.result["energy_available"] is True
    assert src["short_window"] is False
    assert w.result["energy_unavailable"] == {}


def test_rapl_flags_short_and_frozen_windows(tmp_path):
    make_powercap(tmp_path)
    zones = rapl.find_zones(root=tmp_path)
    start = {z.key: 1000 for z in zones}
    moved = {z.key: 2000 for z in zones}
    short = rapl.rapl_energy(zones, start, moved, wall_s=0.0004)
    assert short.short_window and "shorter than the RAPL counter" in short.notes[0]
    frozen = rapl.rapl_energy(zones, start, dict(start), wall_s=0.5)
    assert frozen.short_window and frozen.energy_j == 0
    ok = rapl.rapl_energy(zones, start, moved, wall_s=0.5)
    assert not ok.short_window and ok.notes == []


def _deny(monkeypatch, denied: Path) -> None:
    """Make ``denied`` unreadable: chmod for ordinary users, a patched read for root."""
    denied.chmod(0)
    if os.access(denied, os.R_OK):  # root reads through mode bits
        real = rapl._read_text

        def read_text(path: Path) -> str:
            if Path(path) == denied:
                raise PermissionError(errno.EACCES, "Permission denied", str(path))
            return real(path)

        monkeypatch.setattr(rapl, "_read_text", read_text)


def test_unreadable_energy_uj_is_a_clear_error_with_the_fix(tmp_path, monkeypatch):
    make_powercap(tmp_path)
    _deny(monkeypatch, tmp_path / "intel-rapl:0:2" / "energy_uj")
    with pytest.raises(LabkitError) as info:
        rapl.RaplSampler(root=tmp_path)
    err = info.value
    assert "intel-rapl:0:2/energy_uj" in err.problem and "permission denied" in err.problem
    assert "chmod o+r" in err.fix and "root" in err.fix
    found = power.discover(sources=["rapl"], powercap_root=tmp_path)["rapl"]
    assert found["available"] is False and "chmod" in found["fix"]
    with pytest.raises(LabkitError, match="required energy source rapl"):
        power.measure(sources=["rapl"], powercap_root=tmp_path, require=["rapl"])


def test_missing_powercap_and_empty_powercap_say_why(tmp_path):
    with pytest.raises(LabkitError, match="Linux RAPL not exposed"):
        rapl.find_zones(root=tmp_path / "absent")
    (tmp_path / "empty").mkdir()
    with pytest.raises(LabkitError, match="no intel-rapl zones") as info:
        rapl.find_zones(root=tmp_path / "empty")
    assert "modprobe" in info.value.fix


# -- IOReport ---------------------------------------------------------------------------


def test_ioreport_m1_counts_each_component_once_with_units():
    fx = load("ioreport_m1_delta.json")
    e = ioreport.ioreport_energy(fx["records"], wall_s=fx["window_s"])
    # "CPU Energy" (mJ) is the total; the clusters and cores inside it are not added.
    assert e.components_j["cpu"] == pytest.approx(4.787)
    # "GPU Energy" is in nJ; the "GPU" channel (mJ) measures the same thing.
    assert e.components_j["gpu"] == pytest.approx(1.182345678)
    assert e.components_j["ane"] == 0.0
    assert e.components_j["dram"] == pytest.approx(0.611)
    assert e.energy_j == pytest.approx(4.787 + 1.182345678 + 0.611)
    assert e.summed == ["cpu", "gpu", "ane", "dram"]
    assert e.raw_j["GPU SRAM"] == pytest.approx(0.024)  # kept, but in no component
    assert e.raw_j["ECPU"] == pytest.approx(0.130)
    assert any("GPU SRAM" in n and "not in any component" in n for n in e.notes)
    assert any(n.startswith("cpu: counted CPU Energy") and "PCPU3" in n for n in e.notes)
    assert not e.short_window


def test_ioreport_m1max_names_and_units():
    fx = load("ioreport_m1max_delta.json")
    e = ioreport.ioreport_energy(fx["records"], wall_s=fx["window_s"])
    assert e.components_j == pytest.approx(
        {"cpu": 1.133, "gpu": 6.4205, "ane": 0.905, "dram": 1.250}
    )
    assert e.energy_j == pytest.approx(1.133 + 6.4205 + 0.905 + 1.250)


def test_ioreport_without_a_total_channel_sums_clusters_not_cores():
    fx = load("ioreport_m1_delta.json")
    records = [r for r in fx["records"] if r["channel"] != "CPU Energy"]
    e = ioreport.ioreport_energy(records, wall_s=1.0)
    assert e.components_j["cpu"] == pytest.approx(0.130 + 4.657)  # ECPU + PCPU


def test_ioreport_unit_conversions_and_die_prefixes():
    assert ioreport.to_joules(1500, "mJ") == pytest.approx(1.5)
    assert ioreport.to_joules(2_500_000, "uJ") == pytest.approx(2.5)
    assert ioreport.to_joules(3_000_000_000, " nJ ") == pytest.approx(3.0)
    with pytest.raises(LabkitError, match="unknown unit 'mW'"):
        ioreport.to_joules(5, "mW")
    records = [  # an Ultra-style pair of dies, mixing units
        {"channel": "DIE_0_CPU Energy", "unit": "uJ", "value": 2_000_000},
        {"channel": "DIE_1_CPU Energy", "unit": "mJ", "value": 500},
        {"channel": "DIE_0_PACC0_CPU", "unit": "mJ", "value": 1900},
        {"channel": "GPU Energy", "unit": "nJ", "value": 250_000_000},
        {"channel": "ANE0_0", "unit": "mJ", "value": 10},
        {"channel": "ANE0_1", "unit": "mJ", "value": 20},
    ]
    e = ioreport.ioreport_energy(records, wall_s=1.0)
    assert e.components_j == pytest.approx({"cpu": 2.5, "gpu": 0.25, "ane": 0.03})
    assert ioreport.classify("DIE_1_EACC_CPU") == ("cpu", 1)
    assert ioreport.classify("PACC1_CPU3") == ("cpu", 2)
    assert ioreport.classify("GPU SRAM") is None


def test_ioreport_rejects_negative_and_empty_deltas():
    with pytest.raises(LabkitError, match="negative"):
        ioreport.ioreport_energy([{"channel": "DRAM", "unit": "mJ", "value": -3}], wall_s=1)
    with pytest.raises(LabkitError, match="no CPU, GPU, ANE or DRAM"):
        ioreport.ioreport_energy([{"channel": "ISP", "unit": "mJ", "value": 3}], wall_s=1)


class FakeIOReport:
    """Stands in for _macos.EnergyModelSubscription: samples are counters, deltas records."""

    def __init__(self, records):
        self.records, self.samples, self.closed = records, 0, False

    def sample(self):
        self.samples += 1
        return self.samples

    def delta_records(self, start, end):
        assert (start, end) == (1, 2)
        return self.records

    def close(self):
        self.closed = True


def test_ioreport_sampler_through_measure_with_a_fake_binding():
    binding = FakeIOReport(load("ioreport_m1_delta.json")["records"])
    with power.measure(samplers=[power.IOReportSampler(binding=binding)]) as w:
        pass
    assert binding.closed
    assert w.result["energy_j"] == pytest.approx(4.787 + 1.182345678 + 0.611)
    components = w.result["energy_sources"]["ioreport"]["components_j"]
    assert set(components) == {"cpu", "gpu", "ane", "dram"}


# -- NVML -------------------------------------------------------------------------------


class FakeNVMLError(Exception):
    def __init__(self, value, text):
        super().__init__(text)
        self.value = value


def fake_pynvml(counters: dict[int, list[int]], *, unsupported=(), init_error=None):
    """A module-shaped stand-in for pynvml; each energy read pops the next counter value.

    The reader's first read is its probe at open (pre-Volta GPUs fail there).
    """
    state = {"shutdown": 0}

    def init():
        if init_error:
            raise FakeNVMLError(12, init_error)

    def energy(handle):
        if handle in unsupported:
            raise FakeNVMLError(3, "Not Supported")
        seq = counters[handle]
        return seq.pop(0) if len(seq) > 1 else seq[0]

    def shutdown():
        state["shutdown"] += 1

    return SimpleNamespace(
        NVMLError=FakeNVMLError,
        nvmlInit=init,
        nvmlShutdown=shutdown,
        nvmlDeviceGetCount=lambda: len(counters) + len(unsupported),
        nvmlDeviceGetHandleByIndex=lambda i: i,
        nvmlDeviceGetName=lambda h: b"Tesla P100" if h in unsupported else "NVIDIA H100 80GB HBM3",
        nvmlDeviceGetTotalEnergyConsumption=energy,
        state=state,
    )


def test_nvml_energy_from_recorded_counter_reads():
    reads = dict(load("nvml_reads.json")["reads"])
    e = nvml.nvml_energy({"gpu0": reads[0.0]}, {"gpu0": reads[0.4]}, wall_s=0.4)
    assert e.components_j["gpu0"] == pytest.approx((48214044517 - 48213904117) / 1e3)
    assert 300 < e.energy_j / 0.4 < 400  # ~350 W, as recorded
    assert not e.short_window


def test_nvml_short_window_inside_one_counter_update_is_flagged():
    reads = dict(load("nvml_reads.json")["reads"])
    frozen = nvml.nvml_energy({"gpu0": reads[0.02]}, {"gpu0": reads[0.06]}, wall_s=0.04)
    assert frozen.energy_j == 0 and frozen.short_window
    assert any("update period" in n for n in frozen.notes)
    assert any("did not advance" in n for n in frozen.notes)
    # Short but straddling an update: a number, still flagged as untrustworthy.
    one_step = nvml.nvml_energy({"gpu0": reads[0.08]}, {"gpu0": reads[0.12]}, wall_s=0.04)
    assert one_step.energy_j == pytest.approx(35.084) and one_step.short_window


def test_nvml_counter_going_backwards_is_an_error():
    with pytest.raises(LabkitError, match="went backwards") as info:
        nvml.nvml_energy({"gpu0": 5000}, {"gpu0": 10}, wall_s=1.0)
    assert "persistenced" in info.value.fix


def test_nvml_reader_skips_gpus_without_the_counter():
    fake = fake_pynvml({0: [999_000, 1_000_000, 1_250_000]}, unsupported=(1,))
    sampler = power.NvmlSampler(nvml=fake)
    info = sampler.describe()
    assert info["devices"] == {"gpu0": "NVIDIA H100 80GB HBM3"}
    assert "Tesla P100" in info["skipped"]["gpu1"] and "Not Supported" in info["skipped"]["gpu1"]
    with power.measure(samplers=[sampler]) as w:
        pass
    assert w.result["energy_sources"]["nvml"]["components_j"] == {"gpu0": pytest.approx(250.0)}
    assert w.result["short_window"] is True  # an empty window is shorter than 100 ms
    assert fake.state["shutdown"] == 1


def test_nvml_reader_errors_name_the_cause(monkeypatch):
    with pytest.raises(LabkitError, match=r"no NVIDIA GPU \(NVML: NVML Shared Library Not Found\)"):
        nvml.NvmlReader(nvml=fake_pynvml({}, init_error="NVML Shared Library Not Found"))
    with pytest.raises(LabkitError, match="no NVIDIA GPU with a total-energy counter"):
        nvml.NvmlReader(nvml=fake_pynvml({}, unsupported=(0,)))
    monkeypatch.setitem(__import__("sys").modules, "pynvml", None)  # as if not installed
    with pytest.raises(LabkitError) as info:
        nvml.NvmlReader()
    assert info.value.fix == "pip install 'labkit[nvml]'"


def test_a_source_failing_at_window_end_is_reported_not_estimated():
    backwards = fake_pynvml({0: [8_000, 9_000, 10]})
    with power.measure(samplers=[power.NvmlSampler(nvml=backwards)]) as w:
        pass
    assert w.result["energy_available"] is False and w.result["energy_j"] is None
    assert "went backwards" in w.result["energy_unavailable"]["nvml"]
    assert "nvml: NVML energy counter" in w.result["energy_reason"]
    again = fake_pynvml({0: [8_000, 9_000, 10]})
    window = power.measure(samplers=[power.NvmlSampler(nvml=again)], require=["nvml"])
    with pytest.raises(LabkitError, match="went backwards"):
        with window:
            pass
    assert window.result is None and again.state["shutdown"] == 1


def test_a_failed_window_has_no_result_and_frees_its_samplers():
    fake = fake_pynvml({0: [1, 2]})
    window = power.measure(samplers=[power.NvmlSampler(nvml=fake)])
    with pytest.raises(RuntimeError):
        with window:
            raise RuntimeError("decode crashed")
    assert window.result is None and fake.state["shutdown"] == 1


# -- CPU time, discover, per_token ------------------------------------------------------


def test_parse_proc_stat_counts_busy_ticks_only():
    text = (FIXTURES / "proc_stat.txt").read_text()
    # user + nice + system + irq + softirq; idle, iowait, steal and guest are not added.
    assert cputime.parse_proc_stat(text) == 42719 + 13 + 6080 + 7 + 51
    with pytest.raises(ValueError):
        cputime.parse_proc_stat("intr 1 2 3\n")


def _burn(seconds: float) -> None:
    end = time.process_time() + seconds
    x = 0
    while time.process_time() < end:
        x += 1


def test_live_cpu_time_of_a_busy_window():
    with power.measure(sources=[]) as w:
        _burn(0.2)
    r = w.result
    cores = os.cpu_count()
    assert r["cpu_process_s"] > 0.1
    assert r["cpu_process_s"] <= r["wall_s"] * cores
    assert r["energy_available"] is False and r["energy_j"] is None
    assert r["energy_reason"] == "no energy source was asked for"
    json.dumps(r)  # the result is JSON as it stands
    if Path("/proc/stat").exists():
        # Tick accounting (1/CLK_TCK per CPU) blurs each end by up to one tick per CPU.
        blur = 2 * cores / cputime.clock_ticks_per_s() + 0.01
        assert r["cpu_system_s"] >= r["cpu_process_s"] - blur
        assert r["cpu_system_s"] <= r["wall_s"] * cores + blur
    else:
        assert r["cpu_system_s"] is None and any("/proc/stat" in n for n in r["notes"])


def test_discover_on_this_machine_gives_a_reason_for_every_missing_source():
    found = power.discover()
    json.dumps(found)
    assert set(found) == {"rapl", "ioreport", "nvml", "cpu_process", "cpu_system"}
    assert found["cpu_process"]["available"] is True
    for info in found.values():
        if not info["available"]:
            assert isinstance(info["reason"], str) and info["reason"]
    if not Path("/sys/class/powercap").exists():
        assert found["rapl"]["available"] is False
        assert "/sys/class/powercap" in found["rapl"]["reason"]
    with power.measure() as w:
        pass
    missing = [n for n, info in found.items() if n in power.SOURCES and not info["available"]]
    assert sorted(w.result["energy_unavailable"]) == sorted(missing)
    for name in missing:
        assert f"{name}: " in w.result["energy_reason"]


def _result(energy: dict[str, float] | None, *, wall_s=2.0, cpu_s=1.5):
    sources = {
        name: power.SourceEnergy(
            source=name, energy_j=j, components_j={name: j}, summed=[name], update_period_s=None
        )
        for name, j in (energy or {}).items()
    }
    cpu = {"cpu_process_s": cpu_s, "cpu_children_s": 0.0, "cpu_system_s": 3.0}
    return power.window.build_result(wall_s=wall_s, cpu=cpu, sources=sources, unavailable={})


def test_per_token_costs():
    costs = power.per_token(_result({"rapl": 30.0, "nvml": 90.0}), 400)
    assert costs["j_per_token"] == pytest.approx(0.3)
    assert costs["j_per_token_by_source"] == pytest.approx({"rapl": 0.075, "nvml": 0.225})
    assert costs["cpu_s_per_token"] == pytest.approx(1.5 / 400)
    assert costs["cpu_system_s_per_token"] == pytest.approx(3.0 / 400)
    assert costs["tokens_per_s"] == pytest.approx(200.0)
    assert costs["mean_power_w"] == pytest.approx(60.0)
    blind = power.per_token(_result(None), 400)
    assert blind["j_per_token"] is None and blind["mean_power_w"] is None
    assert blind["tokens_per_s"] == pytest.approx(200.0)
    with pytest.raises(ValueError):
        power.per_token(_result(None), 0)
