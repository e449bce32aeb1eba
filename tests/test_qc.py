"""Tool-suite control on the real model: scores, greedy agreement, verdict arithmetic."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
from scipy.stats import binomtest

from labkit.decoding.drafters.ngram import NgramDrafter
from labkit.suites import qc, toolsuite


@pytest.mark.slow  # tool-suite runs on the real engine, off and on
def test_suite_off_vs_on_greedy(engine):
    tasks = toolsuite.load_tasks()[:6]
    off = qc.run_suite(engine, tasks)
    on = qc.run_suite(engine, tasks, drafter=NgramDrafter(), k=3)
    # task by task, each prompt computed once for both runs (prompt reuse): the same output
    # and the same steps as the two runs made one after the other
    both = qc.run_blocks(engine, tasks, [qc.Block(None, 0, 0.0, 0), qc.Block(NgramDrafter(), 3, 0.0, 0)])
    for alone, together in zip((off, on), both):
        assert together["rows"]["output"].tolist() == alone["rows"]["output"].tolist()
        for t in tasks:
            a, b = alone["records"][t.id], together["records"][t.id]
            assert [(r.tokens, r.draft, r.m) for r in a] == [(r.tokens, r.draft, r.m) for r in b]
    assert off["summary"]["n"] == 6 and 0 <= off["summary"]["score"] <= 1
    for res in (off, on, *both):  # each run's summary is the suite's own scoring of that run's outputs
        again = [toolsuite.score_task(t, out) for t, out in zip(tasks, res["rows"]["output"], strict=True)]
        assert res["summary"] == toolsuite.summarize(again)
    for out in off["rows"]["output"]:
        assert "\n" not in out.rstrip("\n")  # generation stops at the first newline
    div = qc.greedy_divergences(engine, off, on)
    # identical outputs, or each difference is a recorded numerical near-tie
    assert div.empty or div["near_tie"].all()
    if div.empty:
        assert list(off["rows"]["output"]) == list(on["rows"]["output"])


@pytest.mark.slow  # tool-suite runs on the real engine, off and on
def test_a_divergence_replay_computes_the_shared_preamble_once_and_exactly(engine):
    """Explaining a greedy divergence replays the run that chose the token. Over the suite's
    few-shot preamble (kept across tasks, as the run kept it) the replay leaves the preamble
    in the cache, so the next task's replay does not compute its ~1250 tokens again; and the
    row is the same, bit for bit, whether the preamble was cached or computed afresh."""
    from labkit.analysis.lossless import _replay

    tasks = toolsuite.load_tasks()[:2]
    res = qc.run_suite(engine, tasks, drafter=NgramDrafter(), k=2)
    (a, b), prompts = tasks, res["prompts"]
    keep = len(prompts[a.id]) - res["records"][a.id][0].m
    assert keep > 1000 and prompts[a.id][:keep] == prompts[b.id][:keep]  # the shared preamble
    engine.rollback(0)
    fresh = _replay(engine, prompts[a.id], res["records"][a.id], 5)
    assert engine.n_past == keep and engine.kv_tokens == prompts[a.id][:keep]
    cached = _replay(engine, prompts[a.id], res["records"][a.id], 5)  # the preamble reused
    assert (fresh == cached).all()
    other = _replay(engine, prompts[b.id], res["records"][b.id], 3)
    engine.rollback(0)
    assert (other == _replay(engine, prompts[b.id], res["records"][b.id], 3)).all()


def test_verdict():
    v = qc.verdict([0.60, 0.65, 0.70], [0.62, 0.66, 0.64])
    assert v["within_noise"] and v["within_band"] and v["regression_points"] == 0
    assert "within ±10" in v["verdict"] and "inside the measured band" in v["verdict"]
    v = qc.verdict([0.60, 0.65, 0.70], [0.50, 0.52, 0.55], tolerance_pts=5)
    assert not v["within_noise"] and abs(v["regression_points"] - 8.0) < 1e-9
    assert v["verdict"].startswith("regression") and "worst run 10.0 points" in v["verdict"] and "±5" in v["verdict"]


def test_verdict_on_the_chapters_numbers():
    """The chapter: off 50, on 40 and 47, "within the suite's ±10 noise"."""
    v = qc.verdict([0.50], [0.40, 0.47])
    assert v["verdict"].startswith("within ±10") and v["within_noise"]
    assert not v["within_band"] and abs(v["worst_points_below"] - 10) < 1e-9
    assert v["off_band"] == [0.50, 0.50] and v["tolerance_pts"] == 10
    # one point tighter and the 40 is a regression
    assert qc.verdict([0.50], [0.40, 0.47], tolerance_pts=9)["verdict"].startswith("regression")


def _runs(correct: dict[str, list[bool]]) -> pd.DataFrame:
    return pd.DataFrame([{"task": t, "run": r, "correct": c} for t, cs in correct.items() for r, c in enumerate(cs)])


def test_paired_test_mcnemar_and_bootstrap():
    """SYNTHETIC outcomes: 10 tasks x 1 run; on loses 6 tasks and gains none."""
    off = _runs({f"t{i}": [True] for i in range(10)})
    on = _runs({f"t{i}": [i >= 6] for i in range(10)})
    p = qc.paired_test(off, on)
    assert (p["pairs"], p["tasks"], p["lost"], p["gained"]) == (10, 10, 6, 0)
    assert abs(p["mcnemar_p"] - binomtest(6, 6, 0.5).pvalue) < 1e-12 and abs(p["mcnemar_p"] - 2 / 64) < 1e-12
    assert abs(p["diff_pts"] + 60) < 1e-9 and p["ci_high_pts"] < 0 <= 100 + p["ci_low_pts"]
    same = qc.paired_test(off, off)
    assert same["mcnemar_p"] == 1.0 and same["diff_pts"] == 0 and same["ci_low_pts"] == same["ci_high_pts"] == 0


def test_paired_test_pairs_by_task_and_run():
    """SYNTHETIC: the same task in two runs is two pairs; a task's runs are averaged before bootstrapping."""
    off = _runs({"a": [True, False], "b": [True, True]})
    on = _runs({"a": [False, True], "b": [True, True]})
    p = qc.paired_test(off, on)
    assert (p["pairs"], p["tasks"], p["lost"], p["gained"]) == (4, 2, 1, 1) and p["diff_pts"] == 0
    t = qc.task_pairs(off.assign(category="single", error=None, output=["x", "y", "z", "z"]),
                      on.assign(category="single", error=None, output=["x", "q", "z", "z"]))
    assert list(t["same_output"]) == [True, False, True, True]
    assert {"output_off", "output_on", "correct_off", "correct_on"} <= set(t.columns)


@pytest.mark.slow  # tool-suite runs on the real engine, off and on
def test_prompt_reuse_serves_the_prompt_without_computing_it_again(engine):
    """Inside ``prompt_reuse`` a second prefill of the same prompt decodes nothing: the cache
    is rolled back to the prompt's end and the saved last row is served, and what follows
    is bit for bit what followed the first time. Outside it, every prefill computes."""
    ids = [engine.tokenize(toolsuite.build_prompt(t)) for t in toolsuite.load_tasks()[:2]]
    calls = []
    real = engine.decode

    def counted(tokens, **kw):
        calls.append(len(tokens))
        return real(tokens, **kw)

    engine.decode = counted
    try:
        with engine.prompt_reuse() as on:
            assert on
            rows = engine.prefill(ids[0])
            first = engine.logits(-1).copy()
            nxt = int(first.argmax())
            engine.decode([nxt])
            after = engine.logits(-1).copy()
            n = len(calls)
            assert engine.prefill(ids[0]) == rows and len(calls) == n  # nothing computed
            assert engine.n_past == len(ids[0]) and engine.kv_tokens == ids[0]
            assert np.array_equal(engine.logits(-1), first) and engine.argmax() == nxt
            engine.decode([nxt])
            assert np.array_equal(engine.logits(-1), after)
            engine.prefill(ids[1])  # another prompt is computed
            assert len(calls) > n + 1
        n = len(calls)
        engine.prefill(ids[1])  # outside the block: computed again
        assert len(calls) > n
    finally:
        del engine.decode


# -- the tool suite's sequential runs: looks with a Bonferroni level --------------------------
def _suite_runs(rng, p, d, runs, common=0.5):
    """SYNTHETIC per-(task, run) correctness off and on: task i is right with probability p[i]
    off and p[i] + d on; a run's two outputs share their random draw with probability
    ``common`` (the same seed often gives the same sample, as in the real suite)."""
    off, on = [], []
    for r in range(runs):
        u = rng.random(len(p))
        v = np.where(rng.random(len(p)) < common, u, rng.random(len(p)))
        off.append(pd.DataFrame({"task": [f"t{i}" for i in range(len(p))], "run": r, "correct": u < p}))
        on.append(pd.DataFrame({"task": [f"t{i}" for i in range(len(p))], "run": r, "correct": v < p + d}))
    return off, on


def _sequential(off, on, *, runs=3, min_runs=1, tolerance=10.0, alpha=0.05):
    """What qc.control does between passes: look after each pass, stop at the first decided look."""
    passes = qc.run_passes(runs, min_runs)
    level = qc.look_level(passes, alpha)
    for rs in passes:
        n = rs[-1] + 1
        lk = qc.look(pd.concat(off[:n]), pd.concat(on[:n]), tolerance_pts=tolerance, confidence=level)
        if lk["decided"]:
            return lk["answer"], n
    return "undecided", n


@pytest.mark.slow  # 400 simulated suites (~10 s)
def test_sequential_runs_keep_the_error_rate_at_the_tolerance_boundary():
    """SYNTHETIC, 200 replications of a 52-task suite, the recipe's plan (a look after each of up
    to 3 sampled runs, at 98.3% each): speculation costs exactly 10 points (the tolerance), so
    "within tolerance" is the wrong answer; the plan gives it in at most 5% of replications.
    With no effect, "regression" is as rare."""
    rng = np.random.default_rng(7)
    p = rng.uniform(0.3, 0.85, 52)  # no clipping at p + d
    wrong = sum(_sequential(*_suite_runs(rng, p, -0.10, 3))[0] == "within tolerance" for _ in range(200))
    assert wrong <= 10, wrong
    false_alarm = sum(_sequential(*_suite_runs(rng, p, 0.0, 3))[0] == "regression" for _ in range(200))
    assert false_alarm <= 10, false_alarm


def test_sequential_runs_stop_early_on_a_suite_like_the_real_one():
    """SYNTHETIC, shaped like LAB:04-9c2470-gfiwe (52 tasks, most of them always wrong or always
    right at T=0.7, ~7% of pairs discordant): with no effect, the plan decides "within
    tolerance" in >= 95% of 200 replications, and at its first look (one sampled run) in >= 60%."""
    rng = np.random.default_rng(11)
    p = np.concatenate([np.full(30, 0.02), np.full(8, 0.9), rng.uniform(0.2, 0.8, 14)])
    out = [_sequential(*_suite_runs(rng, p, 0.0, 3, common=0.6)) for _ in range(200)]
    assert sum(a == "within tolerance" for a, _ in out) >= 190
    assert sum(a == "within tolerance" and n == 1 for a, n in out) >= 120
    assert qc.run_passes(3, 1) == [[0], [1], [2]] and qc.look_level([[0], [1], [2]]) == pytest.approx(1 - 0.05 / 3)
    assert qc.run_passes(3, 2) == [[0, 1], [2]] and qc.run_passes(3, None) == [[0, 1, 2]]
    assert qc.look_level([[0, 1, 2]]) is None
    assert qc.runs_line({"runs": 1, "max_runs": 3, "stopped": "after 1 of up to 3"}) == \
        "1 of up to 3 (stopped after 1 of up to 3)"
    assert qc.runs_line({"runs": 3, "max_runs": 3, "stopped": None}) == "3 of up to 3"


@pytest.mark.slow  # tool-suite runs on the real engine, off and on
def test_sequential_sampled_runs_are_the_runs_a_fixed_plan_makes(engine):
    """Run r is seeded as always: two sampled runs measured one pass at a time (a look between)
    give the outputs of the same two runs measured in one pass; a tolerance that decides at
    the first look stops there, and says so."""
    tasks = toolsuite.load_tasks()[:2]
    kw = {"drafters": {"ngram": NgramDrafter()}, "k": 2, "temperature": 0.7, "seed": 3}
    fixed = qc.control(engine, tasks, runs=2, **kw)
    seq = qc.control(engine, tasks, runs=2, min_runs=1, tolerance_pts=0.0, **kw)  # 2 tasks: undecided at 1 run
    assert fixed["looks"].empty and fixed["stopped"] is None and fixed["runs"] == 2
    assert seq["runs"] == 2 and len(seq["looks"]) == 2 and not seq["looks"]["decided"].iloc[0]
    cols = ["task", "run", "mode", "output_off", "output_on"]
    assert seq["task_pairs"][cols].equals(fixed["task_pairs"][cols])
    early = qc.control(engine, tasks, runs=2, min_runs=1, tolerance_pts=100.0, **kw)  # decided at once
    assert early["runs"] == 1 and early["max_runs"] == 2 and "after 1 of up to 2" in early["stopped"]
    assert early["looks"]["answer"].tolist() == ["within tolerance"]
    assert early["scores"]["run"].max() == 0 and len(early["scores"]) == 4  # greedy off/on, one sampled off/on


@pytest.mark.slow  # tool-suite runs on the real engine
def test_sampled_runs_at_temperature_zero_are_not_looked_at(engine):
    """At toolsuite_temperature 0 the "sampled" runs are greedy again: one pass, every run, no look."""
    tasks = toolsuite.load_tasks()[:1]
    res = qc.control(engine, tasks, drafters={"ngram": NgramDrafter()}, k=2, runs=2, min_runs=1, temperature=0.0)
    assert res["looks"].empty and res["stopped"] is None and res["runs"] == 2
    assert len(res["scores"]) == 2 + 2 * 2 and res["verdicts"]["ngram"]["within_noise"] in (True, False)
