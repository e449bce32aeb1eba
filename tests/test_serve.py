"""llama-server (built from the wheel's own llama.cpp sources) driven by labkit's client.

The build is a session fixture (``labkit server build``'s function: cached per machine,
several minutes the first time). Every server a test starts listens on 127.0.0.1 and is
stopped in a ``finally`` or by its context manager, whatever the test does.
"""

from __future__ import annotations

import os
import signal
import socket
import time

import pytest

from labkit.artifacts import server_build
from labkit.decoding.loop import run, tokens_of
from labkit.measure import concurrency, serve
from labkit.suites.workloads import load_workload


@pytest.fixture(scope="session")
def server_binary():
    t0 = time.perf_counter()
    info = server_build.build(progress=print)
    print(f"llama-server build: {time.perf_counter() - t0:.1f} s (cached: {info['cached']})")
    return info["path"]


@pytest.fixture(scope="module")
def prompts(engine):
    return [engine.tokenize(p.text) for p in load_workload("edit", limit=2)]


def _args(model, port, **kw):
    return serve.server_args(model=model, port=port, c=kw.pop("c", 1), n_ctx_per_slot=512, threads=2, **kw)


@pytest.mark.slow  # llama-server
def test_build_is_cached_and_recorded(server_binary):
    info = server_build.find()
    assert info["path"] == server_binary and os.access(server_binary, os.X_OK)
    assert len(info["llama_cpp_commit"]) == 40 and "GGML_NATIVE=OFF" in info["cmake_args"]
    assert server_build.build()["cached"] is True


@pytest.mark.slow  # llama-server
def test_bad_model_path_is_a_labkit_error_with_the_log_tail(server_binary, tmp_path):
    port = serve.free_port()
    srv = serve.Server(server_binary, _args(str(tmp_path / "missing.gguf"), port), port=port, health_timeout_s=30)
    with pytest.raises(serve.ServerError) as e:
        with srv:
            pass
    assert "exited" in e.value.problem and e.value.log_tail
    assert "missing.gguf" in e.value.log_tail
    assert srv.proc.poll() is not None
    srv.cleanup()


@pytest.mark.slow  # llama-server
def test_port_in_use_is_a_labkit_error_with_the_log_tail(server_binary, embedded):
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        s.listen(1)
        port = s.getsockname()[1]
        srv = serve.Server(server_binary, _args(str(embedded.path), port), port=port, health_timeout_s=30)
        with pytest.raises(serve.ServerError) as e:
            with srv:
                pass
    assert "exited" in e.value.problem and e.value.log_tail
    assert srv.proc.poll() is not None
    srv.cleanup()


@pytest.mark.slow  # llama-server
def test_killed_mid_run_keeps_the_measured_requests(server_binary, embedded, prompts):
    port = serve.free_port()
    srv = serve.Server(server_binary, _args(str(embedded.path), port), port=port)
    kept: list = []

    def kill_after_two(res, server):
        if len(kept) == 2:
            os.killpg(server.proc.pid, signal.SIGKILL)
            server.proc.wait(10)

    try:
        with srv:
            with pytest.raises(serve.ServerError) as e:
                serve.drive(srv, [prompts[0]] * 6, c=1, max_tokens=8, kept=kept, on_result=kill_after_two)
    finally:
        srv.cleanup()
    assert "died mid-run" in e.value.problem
    assert len(e.value.kept) == 2 and kept == e.value.kept
    assert all(len(r["tokens"]) > 0 and r["ttlt_ms"] >= r["ttft_ms"] > 0 for r in kept)


@pytest.mark.slow  # llama-server
def test_spec_off_and_on_match_labkit_and_report_acceptance(server_binary, embedded, engine, prompts):
    res = serve.bench_serve(server_binary, str(embedded.path), prompts, cs=[1, 2], ks=[0, 3],
                            spec_type="ngram-simple", n_ctx_per_slot=512, max_tokens=16, control=True)
    aa = [r for r in res["rows"] if r["drafter"] == "aa"]
    # the A/A arm: llama-server's plain arm again, at each c, with its ratio over plain
    assert [(r["c"], r["k"], r["engine"]) for r in aa] == [(1, 0, "llama-server"), (2, 0, "llama-server")]
    assert all(r["speedup"] > 0 and r["requests"] == 2 for r in aa)
    rows = {(r["c"], r["k"]): r for r in res["rows"] if r["drafter"] != "aa"}
    assert set(rows) == {(1, 0), (1, 3), (2, 0), (2, 3)}
    for (_c, k), r in rows.items():
        assert r["requests"] == 2 and r["agg_tok_s"] > 0
        assert (r["acceptance"] is None) == (k == 0) or r["drafted"] == 0
    assert sum(rows[(c, 3)]["drafted"] for c in (1, 2)) > 0  # the server drafted on the edit prompts
    # llama-server's own /metrics counters (--metrics), the warm-up request excluded: per draft
    # position, never more accepted than verification steps, and falling with position
    for c in (1, 2):
        r = rows[(c, 3)]
        if r["draft_steps"]:
            per = r["accepted_per_pos"]
            assert 0 < len(per) <= 3 and all(0 <= n <= r["draft_steps"] for n in per)
            assert per == sorted(per, reverse=True)
    assert rows[(1, 0)]["accepted_per_pos"] == [] and not rows[(1, 0)]["draft_steps"]
    # greedy llama-server, spec off and on, gives labkit's single-stream plain output
    engine.reset()
    ref = {i: tokens_of(run(engine, p, max_tokens=16)) for i, p in enumerate(prompts)}
    concurrency.server_lossless(engine, prompts, ref, res)
    assert all(r["lossless"] for r in res["rows"]), [r["divergences"] for r in res["rows"]]


def _labkit(*args, check=True):
    import subprocess
    import sys

    p = subprocess.run([sys.executable, "-m", "labkit.cli", *args], capture_output=True, text=True, timeout=1500)
    if check and p.returncode != 0:
        raise AssertionError(f"labkit {args} exited {p.returncode}:\n{p.stderr[-3000:]}")
    return p


@pytest.mark.slow  # llama-server
def test_slots_are_erased_between_arms_and_every_process_is_stopped(server_binary, embedded, prompts, tmp_path):
    """The grid keeps one server per arm configuration; erasing its slots leaves no cached
    cell (what a fresh server has), and a server without --slot-save-path refuses with the fix."""
    port = serve.free_port()
    with serve.Server(server_binary, _args(str(embedded.path), port, c=2, slot_save_path=str(tmp_path)),
                      port=port) as srv:
        serve.drive(srv, [prompts[0], prompts[1]], c=2, max_tokens=8)
        assert srv.erase_slots(2) >= len(prompts[0]) + len(prompts[1])  # both requests' cells were held
        assert srv.erase_slots(2) == 0
    port = serve.free_port()
    with serve.Server(server_binary, _args(str(embedded.path), port), port=port) as srv:
        with pytest.raises(serve.ServerError) as e:
            srv.erase_slots(1)
    assert "--slot-save-path" in e.value.fix

    import psutil

    before = {p.pid for p in psutil.Process().children(recursive=True)}
    res = serve.bench_serve(server_binary, str(embedded.path), prompts, cs=[1, 2], ks=[0, 2], n_ctx_per_slot=512,
                            max_tokens=8, control=True)
    assert "(3)" in res["servers"] and "-np 2" in res["servers"]  # plain, k=2, and the A/A's own process
    left = {p.pid for p in psutil.Process().children(recursive=True)} - before
    assert not left, f"llama-server processes left running: {left}"


def test_the_draft_length_reaches_ngram_simple():
    """llama-server's ngram-simple drafts its m-gram size (default 48), whatever --spec-draft-n-max says:
    the k of an arm must be passed as --spec-ngram-simple-size-m too."""
    a = serve.server_args(model="m.gguf", port=1, c=1, n_ctx_per_slot=512, threads=2, spec_type="ngram-simple", k=3)
    assert a[a.index("--spec-ngram-simple-size-m") + 1] == "3" and a[a.index("--spec-draft-n-max") + 1] == "3"
    # and it drafts nothing when its m-gram is shorter than its lookup n-gram (upstream: copy_max < size_n)
    assert a[a.index("--spec-ngram-simple-size-n") + 1] == "3"
    one = serve.server_args(model="m.gguf", port=1, c=1, n_ctx_per_slot=512, threads=2, spec_type="ngram-simple", k=1)
    assert one[one.index("--spec-ngram-simple-size-n") + 1] == "1"
    plain = serve.server_args(model="m.gguf", port=1, c=1, n_ctx_per_slot=512, threads=2, spec_type="ngram-simple", k=0)
    assert "--spec-type" not in plain and "--metrics" in plain


@pytest.mark.parametrize("bad", [["--c", "0"], ["--k", "-1"], ["--c", "1,x"], ["--workload", "nope"]])
@pytest.mark.slow
def test_bench_concurrency_bad_input_exits_2_with_a_fix(bad):
    p = _labkit("bench", "concurrency", *bad, check=False)
    assert p.returncode == 2 and "fix:" in p.stderr


@pytest.mark.slow  # llama-server
def test_server_info_and_bench_concurrency_json(server_binary):
    import json

    info = json.loads(_labkit("server", "info", "--json").stdout)
    assert info["built"] and info["path"] == server_binary
    p = _labkit("bench", "concurrency", "--c", "1,2", "--k", "0,2", "--workload", "edit", "--prompts", "2",
                "--max-tokens", "8", "--json")
    d = json.loads(p.stdout)
    assert {(r["c"], r["k"]) for r in d["rows"]} == {(1, 0), (1, 2), (2, 0), (2, 2)}
    assert all(r["lossless"] for r in d["rows"])
    assert {(v["c"], v["k"]) for v in d["verdicts"]} == {(1, 2), (2, 2)} and all(v["pairs"] == 1 for v in d["verdicts"])
    assert d["provenance"]["recipe"]["name"] == "default" and "non_monotonic" in d


@pytest.mark.slow  # llama-server
def test_notebook_07_under_reproduce(store, server_binary):
    from labkit.provenance import reproduce as rp
    from labkit.provenance import tracking
    from labkit.report.queries import load_table

    params = {"concurrency": [1, 2], "production_concurrency": 2, "k": [0, 2], "prompts_per_workload": 1,
              "max_tokens": 8, "runs": 1}
    s = rp.reproduce(only=["07"], out_dir=str(store / "out"), params=params)
    assert s["ok"], [(r["notebook"], r["error"]) for r in s["results"]]
    c = tracking.client()
    run = c.get_run(s["results"][0]["run_id"])
    table = load_table(c, run, "concurrency")
    assert set(table["engine"]) == {"labkit", "llama-server"} and set(table["c"]) == {1, 2}
    verdict = load_table(c, run, "concurrency-verdict")
    assert len(verdict) == 1 and verdict["c"].iloc[0] == 2
    # one round: no interval, so no measurable difference is the honest verdict here
    assert verdict["verdict"].iloc[0] in ("speculation pays at c=2", "loses at c=2", "no measurable difference at c=2")
    assert verdict["aa_verdict"].iloc[0] is not None  # labkit's loop carried its A/A arm
    assert run.data.tags["concurrency.verdict"] == verdict["verdict"].iloc[0]
