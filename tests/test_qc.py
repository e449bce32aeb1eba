"""Tool-suite control on the real model: scores, greedy agreement, verdict arithmetic."""

from __future__ import annotations

from labkit.decoding.drafters.ngram import NgramDrafter
from labkit.suites import qc, toolsuite


def test_suite_off_vs_on_greedy(engine):
    tasks = toolsuite.load_tasks()[:6]
    off = qc.run_suite(engine, tasks)
    on = qc.run_suite(engine, tasks, drafter=NgramDrafter(), k=3)
    assert off["summary"]["n"] == 6 and 0 <= off["summary"]["score"] <= 1
    for out in off["rows"]["output"]:
        assert "\n" not in out.rstrip("\n")  # generation stops at the first newline
    div = qc.greedy_divergences(engine, off, on)
    # identical outputs, or each difference is a recorded numerical near-tie
    assert div.empty or div["near_tie"].all()
    if div.empty:
        assert list(off["rows"]["output"]) == list(on["rows"]["output"])


def test_verdict():
    v = qc.verdict([0.60, 0.65, 0.70], [0.62, 0.66, 0.64])
    assert v["within_noise"] and v["regression_points"] == 0 and "within noise" in v["verdict"]
    v = qc.verdict([0.60, 0.65, 0.70], [0.50, 0.52, 0.55])
    assert not v["within_noise"] and abs(v["regression_points"] - 8.0) < 1e-9 and "8.0 points" in v["verdict"]
