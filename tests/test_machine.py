"""The machine profile: a real streaming read, a real probe on the embedded model (llama.cpp),
the per-host cache and its refusals, `labkit machine probe` logged to a real MLflow store."""

from __future__ import annotations

import dataclasses
import json
import time

import numpy as np
import pytest

from labkit.analysis import plan
from labkit.artifacts.gguf_profile import read_profile
from labkit.errors import LabkitError
from labkit.measure import machine

HOST = {"label": "box-a", "cpu": "cpu", "cores": 2, "memory_bytes": 1, "accelerator": "none"}
OTHER = {**HOST, "label": "box-b", "cpu": "another cpu"}
BUILD = {"llama_cpp_python": "0.3.36", "cmake_args": "x", "system_info": "AVX2 = 1"}


@pytest.fixture
def profiles(tmp_path, monkeypatch):
    d = tmp_path / "machine"
    d.mkdir()
    monkeypatch.setattr(machine, "profiles_dir", lambda: d)
    return d


def _profile(host):
    return {"key": machine.cache_key(host, BUILD), "host_fingerprint": host, "host": {"bandwidth_gbs": 5.0},
            "overhead_ms": 0.3, "device": None, "device_note": "not measured: no accelerator"}


def test_streaming_read_measures_bandwidth():
    bw = machine.host_bandwidth(threads=2, gib=0.125, repeats=3)
    assert 0.5 < bw["min"] <= bw["median"] <= bw["max"] < 500 and bw["threads"] == 2


def test_no_accelerator_is_said_not_guessed():
    assert machine.device_bandwidth("none", {})["note"] == "not measured: no accelerator"
    assert "cannot offload" in machine.device_bandwidth("NVIDIA X, 24 GiB", {"gpu_offload_supported": False})["note"]


def test_a_build_with_other_patches_is_another_profile():
    patched = {**BUILD, "patches": [{"name": "a.patch", "sha256": "1"}]}
    assert machine.cache_key(HOST, BUILD) != machine.cache_key(HOST, patched)
    assert machine.cache_key(HOST, patched) != machine.cache_key(HOST, {**BUILD, "patches": [{"sha256": "2"}]})


def test_cache_is_per_host_and_another_hosts_profile_must_be_named(profiles, tmp_path):
    with pytest.raises(LabkitError, match="no machine profile for this host") as e:
        machine.load("this", host=HOST, build=BUILD)
    assert "labkit machine probe" in e.value.fix
    machine.save(_profile(OTHER))
    with pytest.raises(LabkitError, match="other hosts") as e:
        machine.load("this", host=HOST, build=BUILD)
    assert "box-b" in e.value.problem and "--profile" in e.value.fix
    assert machine.load("box-b", host=HOST, build=BUILD)["host_fingerprint"]["label"] == "box-b"  # named: used
    machine.save(_profile(HOST))
    assert machine.load("this", host=HOST, build=BUILD)["host_fingerprint"]["label"] == "box-a"
    with pytest.raises(LabkitError, match="no cached machine profile for host 'box-c'"):
        machine.load("box-c", host=HOST, build=BUILD)
    # the same host with another engine build is another profile
    with pytest.raises(LabkitError, match="other hosts or builds"):
        machine.load("this", host=HOST, build={**BUILD, "cmake_args": "-DGGML_CUDA=on"})


def test_plan_refuses_another_hosts_profile_unless_named(profiles, capsys, embedded, monkeypatch):
    from labkit import cli
    from labkit.commands import plan as plan_cmd

    monkeypatch.setattr(plan_cmd, "_host_build", lambda: (HOST, BUILD))
    machine.save(_profile(OTHER))
    argv = ["plan", "--model", str(embedded.path), "--acceptance", "0.8,0.6", "--n-max", "0..2"]
    assert cli.main(argv) == 2
    assert "other hosts" in capsys.readouterr().err
    assert cli.main([*argv, "--profile", "box-b", "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["predicted"] and doc["E"][0]["n_max"] == 0


@pytest.fixture(scope="module")
def probed():
    from labkit.engines.llamacpp import build_info
    from labkit.provenance.fingerprint import host_info

    return machine.probe(host=host_info(), build=build_info(), threads=2, rounds=4, gib=0.25)


@pytest.mark.slow
def test_probe_measures_this_host_and_predicts_its_own_calibration_model(probed, embedded):
    p = probed
    assert p["kind"] == "measured" and p["device"] is None and p["device_note"] == "not measured: no accelerator"
    assert p["host"]["bandwidth_gbs"] > 0.5 and 0 < p["overhead_ms"] < p["calibration"]["H_ms"]
    assert p["host"]["row_ns_per_param"] > 0 and p["host"]["matvec_ns_per_param"] >= 0
    assert p["threads"] == 2 and set(p["host"]["bandwidth_by_threads"]) == {"1", "2"}  # what plans at 1 thread read
    assert all(v > 0.5 for v in p["host"]["bandwidth_by_threads"].values())
    assert p["host"]["bandwidth_gbs"] >= p["host"]["bandwidth"]["median"]  # the stream, or the step's faster read
    assert p["host"]["bandwidth_by_threads"]["2"] == p["host"]["bandwidth_gbs"]
    prof = read_profile(embedded.path)
    by_m = {r["m"]: r["median"] for r in p["calibration"]["verify"]}
    errs = [plan.verify_ms(prof, p, plan.Placement(), m) / by_m[m] - 1 for m in by_m]
    assert abs(errs[0]) < 0.05  # m = 1 is H by construction
    assert sorted(abs(e) for e in errs)[len(errs) // 2] < 0.25  # in sample: the form, not the numbers
    # the head (tied, unrepacked) measured apart: one-logit-row decodes beside every-row ones
    cal, host = p["calibration"], p["host"]
    assert [r["m"] for r in cal["body"]] == list(range(2, 9)) and cal["head_params"] == plan.head_params(prof)
    assert set(host["head_rows_ns_per_param_by_m"]) == set(host["rows_ns_per_param_by_m"]) == {str(m) for m in
                                                                                               range(2, 9)}


@pytest.mark.slow
def test_machine_probe_command_caches_and_logs_a_run(profiles, store, capsys):
    from labkit import cli
    from labkit.provenance import tracking

    assert cli.main(["machine", "probe", "--rounds", "2", "--gib", "0.25", "--threads", "2", "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["lab_id"].startswith("LAB:")
    assert cli.main(["machine", "show"]) == 0  # the human form: one line per cached profile, this host's first
    first = capsys.readouterr().out.splitlines()[0]
    assert "GB/s" in first and "(this host;" in first and f"[{doc['lab_id']}]" in first
    assert list(profiles.glob("profile-*.json"))
    run = tracking.find_run(tracking.client(), doc["lab_id"].removeprefix("LAB:"))
    assert run.data.metrics["host_bandwidth_gbs"] == pytest.approx(doc["host"]["bandwidth_gbs"])


def _bench(H, body, extra, ms=range(2, 9)):
    """A verify bench result as bench_verify(body=True) writes it, from exact curves (constructed
    numbers, no noise): every-row V(m) = body(m) + extra(m), one-logit-row body(m), H at m = 1."""
    return {"verify": [{"m": 1, "median": H, "values": [H, H]}]
            + [{"m": m, "median": body(m) + extra(m), "values": [body(m) + extra(m)] * 2} for m in ms],
            "body": [{"m": m, "median": body(m), "values": [body(m)] * 2} for m in ms],
            "head_extra": [{"m": m, "values": [extra(m)] * 2} for m in ms]}


def test_the_head_is_its_own_op_class_and_each_measured_m_is_priced_as_measured(embedded):
    """Constructed curves on the embedded model's real header (tied 262,144 × 640 head): the
    body's extra is a staircase (4-row tiles: flat within a tile), the head's a line. The
    calibrated planner gives back V(m) exactly at every measured m, the line beyond it, and
    prices an untied-head model's head at the body's rates (it is repacked like the body)."""
    prof = read_profile(embedded.path)
    head = plan.head_params(prof)
    assert head == prof.output_elements == 262144 * 640 and prof.output_tied
    H, bw, over = 20.0, 25.0, 0.1
    body = lambda m: H + 2.0 * (m - 1) + 3.0 * ((m - 1) // 4)  # noqa: E731
    extra = lambda m: 1.0 + 2.5 * (m - 1)  # noqa: E731
    cal = machine.calibrate(_bench(H, body, extra), prof, bandwidth_gbs=bw, overhead_ms=over)
    assert cal["head_params"] == head and set(cal["head_rows_ns_per_param_by_m"]) == {str(m) for m in range(2, 9)}
    prof_m = {"overhead_ms": over, "host": {"bandwidth_gbs": bw, **{k: cal[k] for k in
                                            machine.COMPUTE_RATES + machine.HEAD_RATES + machine.RATE_TABLES}}}
    for m in range(1, 9):
        assert plan.verify_ms(prof, prof_m, plan.Placement(), m) == pytest.approx(body(m) + (m > 1) * extra(m))
    # beyond the table: each class's line (the head's exact, the staircase's least squares
    # with the odd-m term, which an even R does not pay)
    got = plan.verify_ms(prof, prof_m, plan.Placement(), 12)
    ms = np.arange(2, 9)
    (a, b, _odd), *_ = np.linalg.lstsq(np.column_stack([np.ones(len(ms)), ms, ms % 2]),
                                       [body(m) for m in ms], rcond=None)
    assert got == pytest.approx(a + 12 * b + extra(12))
    # one class (no one-row curve, as older profiles): the whole model at the line's rates
    flat = machine.calibrate({"verify": _bench(H, body, extra)["verify"]}, prof, bandwidth_gbs=bw, overhead_ms=over)
    assert flat["head_row_ns_per_param"] is None and flat["head_params"] == 0
    # an untied head: no head class, the head's parameters at the body's rates
    untied = dataclasses.replace(prof, output_tied=False)
    assert plan.head_params(untied) == 0
    two = plan.verify_ms(untied, prof_m, plan.Placement(), 2)
    act = machine.active_params(prof)["params"]
    assert two == pytest.approx(plan.verify_ms(prof, prof_m, plan.Placement(), 1)
                                + act * cal["rows_ns_per_param_by_m"]["2"] * 1e-6)


def test_a_step_faster_than_the_streaming_read_sets_the_bandwidth_and_m1_stays_h(embedded):
    """Constructed curves (labelled numbers): a streaming read that under-read (a busy
    neighbour) would price the one-row step above the H it measured; the step's own read rate
    is then the bandwidth, recorded with where it came from, and m = 1 is H again."""
    prof = read_profile(embedded.path)
    H, over = 8.0, 0.5
    act = machine.active_params(prof)
    slow_bw = act["bytes"] / (9.0 * 1e6)  # reading the model would take 9 ms > H - overhead
    body = lambda m: H + 1.0 * (m - 1)  # noqa: E731
    extra = lambda m: 0.5 * (m - 1)  # noqa: E731
    cal = machine.calibrate(_bench(H, body, extra), prof, bandwidth_gbs=slow_bw, overhead_ms=over)
    assert cal["stream_bandwidth_gbs"] == slow_bw and cal["bandwidth_gbs"] == pytest.approx(act["bytes"] / 7.5e6)
    assert "plain step" in cal["bandwidth_from"] and cal["matvec_ns_per_param"] == 0.0
    prof_m = {"overhead_ms": over, "host": {"bandwidth_gbs": cal["bandwidth_gbs"], **{
        k: cal[k] for k in machine.COMPUTE_RATES + machine.HEAD_RATES + machine.RATE_TABLES}}}
    for m in range(1, 9):
        assert plan.verify_ms(prof, prof_m, plan.Placement(), m) == pytest.approx(body(m) + (m > 1) * extra(m))
    # a streaming read the step does not beat is the bandwidth, as before
    fast = machine.calibrate(_bench(H, body, extra), prof, bandwidth_gbs=4 * slow_bw, overhead_ms=over)
    assert fast["bandwidth_gbs"] == 4 * slow_bw and fast["bandwidth_from"] == machine.STREAM_READ


def test_a_plan_at_fewer_threads_reads_that_counts_bandwidth_and_scales_compute():
    """Constructed profile (labelled numbers): probed at 2 threads, bandwidth read at 1 and 2."""
    rates = {"matvec_ns_per_param": 1.0, "row_ns_per_param": 0.5, "batch_ns_per_param": 0.2, "odd_ns_per_param": 0.1}
    prof = {"threads": 2, "overhead_ms": 0.3, "host": {"bandwidth_gbs": 20.0, **rates,
                                                       "bandwidth_by_threads": {"1": 12.0, "2": 20.0}}}
    assert machine.at_threads(prof, None) is prof and machine.at_threads(prof, 2) is prof
    one = machine.at_threads(prof, 1)
    assert one["host"]["bandwidth_gbs"] == 12.0 and one["threads"] == 1 and one["overhead_ms"] == 0.3
    assert {k: one["host"][k] for k in rates} == {k: 2 * v for k, v in rates.items()}  # T/n = 2
    assert "scaled 2/1" in one["derived"] and prof["host"]["bandwidth_gbs"] == 20.0  # the original is untouched
    with pytest.raises(LabkitError, match="no host bandwidth at 3 thread"):
        machine.at_threads(prof, 3)
    with pytest.raises(LabkitError, match="at least 1"):
        machine.at_threads(prof, 0)
    old = {"threads": 2, "host": {"bandwidth_gbs": 20.0, **rates}}  # a profile from before thread counts
    with pytest.raises(LabkitError, match="re-run `labkit machine probe`"):
        machine.at_threads(old, 1)


@pytest.mark.slow  # verify(m) of six models (two rounds each) on the real engine
def test_plan_check_predicts_every_model_and_the_thread_count_placement(probed):
    from labkit.measure import plancheck

    res = plancheck.run_check(probed, prompts=None, rounds=2)
    v = res["verify"]
    one = f"{plancheck.EMBEDDED} @ 1 thread"
    assert set(v["model"]) == {plancheck.EMBEDDED, "synthetic-dense", "synthetic-dense-x2", "synthetic-moe",
                               "synthetic-moe-x2", one}
    assert (v.groupby("model")["m"].apply(sorted).map(lambda ms: ms == list(range(1, 9)))).all()
    t1 = v[v["model"] == one]
    assert (t1["threads"] == 1).all() and not t1["in_sample"].any()
    assert (v[v["model"] == plancheck.EMBEDDED]["threads"] == 2).all()
    assert ((v["predicted_ms"] > 0) & (v["measured_ms"] > 0)).all()
    assert v["error"].equals(v["predicted_ms"] / v["measured_ms"] - 1)
    r = res["residual"]
    assert one in r["per_model"] and r["models"] == 6 and res["cells"] is None
    line = next(x for x in plancheck.summary_lines(res) if x.strip().startswith(one))
    assert line.endswith("(out of sample: the probe's rates at another thread count)")  # not SYNTHETIC


# -- the last-level cache: what a cache-sized model reads from ------------------------------
def test_llc_is_the_highest_cache_level_sysfs_reports(tmp_path):
    """A recorded sysfs layout (the Intel box of 2026-12-06: L1d 48K, L1i 64K, L2 2048K,
    L3 491520K) plus an entry the parser must skip; no sysfs at all: None."""
    for i, (level, size) in enumerate([("1", "48K"), ("1", "64K"), ("2", "2048K"), ("3", "491520K"), ("4", "??")]):
        d = tmp_path / f"index{i}"
        d.mkdir()
        (d / "level").write_text(f"{level}\n")
        (d / "size").write_text(f"{size}\n")
    assert machine.llc_bytes(tmp_path) == 491520 * 1024
    (tmp_path / "index3" / "size").write_text("32M\n")
    assert machine.llc_bytes(tmp_path) == 32 * 2**20
    assert machine.llc_bytes(tmp_path / "absent") is None


@pytest.mark.slow  # one synthetic model's verify(m), plain and with the cache flushed
def test_a_model_within_the_cache_is_also_checked_with_the_cache_flushed(probed):
    """plan --check measures a model whose step fits in the last-level cache twice: back to
    back, as its decodes run, and with the cache flushed before every decode, as a model
    larger than the cache runs; the second is reported beside the error, never in it."""
    from labkit.measure import plancheck

    calls = []
    flush = machine.cache_flusher(64 * 2**20)
    v = plancheck.verify_check(probed, names=["synthetic-dense"], rounds=2, threads=2, llc=200 * 2**20, kv_depth=32)
    assert v["cache_resident"].all() and (v["measured_flushed_ms"] > 0).all()
    assert np.allclose(v["error_flushed"], v["predicted_ms"] / v["measured_flushed_ms"] - 1)
    assert v["error"].equals(v["predicted_ms"] / v["measured_ms"] - 1)  # the headline is the plain measurement
    small = plancheck.verify_check(probed, names=["synthetic-dense"], rounds=2, threads=2, llc=1, kv_depth=32)
    assert not small["cache_resident"].any() and small["measured_flushed_ms"].isna().all()
    res = {"verify": plancheck.with_drift(v, probed), "cells": None}
    res["residual"] = plancheck.residual(res["verify"], None)
    assert res["residual"]["cache_resident_models"] == ["synthetic-dense"]
    lines = plancheck.summary_lines(res)
    at = next(i for i, x in enumerate(lines) if x.strip().startswith("synthetic-dense"))
    assert "last-level cache" in lines[at + 1] and "flushed before each decode" in lines[at + 1]
    # the flush runs before every timed decode and outside its time
    from labkit.artifacts import zoo
    from labkit.engines.llamacpp import LlamaCppEngine
    from labkit.measure import verify_cost

    def slow_flush():
        calls.append(1)
        flush()
        time.sleep(0.05)

    with LlamaCppEngine(str(zoo.get("synthetic-dense").path), n_ctx=128, n_threads=2) as e:
        r = verify_cost.bench_verify(e, m_values=[1, 2], rounds=3, kv_depth=32, before=slow_flush)
    assert len(calls) == 3 * 2
    assert max(x["max"] for x in r["verify"]) < 50, "the flush's own time is not the decode's"
