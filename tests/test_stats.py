"""Statistics derived from records: denominators as documented."""

from __future__ import annotations

import pytest

from labkit.analysis.stats import repetition, spread, summarize
from labkit.decoding.records import StepRecord


def rec(step, mode, k, outcomes, tokens, draft_ms=1.0, verify_ms=10.0, t=0.0):
    acc = sum(1 for o in outcomes if o == 1)
    return StepRecord(step=step, mode=mode, k=k, drafted=len(outcomes), accepted=acc, outcomes=outcomes,
                      draft=[0] * len(outcomes), m=len(outcomes) + 1 if mode != "prefill" else 5,
                      draft_ms=draft_ms, verify_ms=verify_ms, accept_ms=0.5, tokens=tokens,
                      from_draft=[True] * acc + [False], t_ms=t)


def test_acceptance_denominators():
    recs = [
        rec(0, "prefill", 0, [], [1], t=5),
        rec(1, "spec", 3, [1, 1, 0], [2, 3, 4], t=20),  # 2 accepted, 1 rejected
        rec(2, "spec", 3, [1, 0, -1], [5, 6], t=35),  # 1 accepted, 1 rejected, 1 untested
        rec(3, "spec", 3, [1, 1, 1], [7, 8, 9, 10], t=50),
        rec(4, "plain", 0, [], [11], t=60),
    ]
    s = summarize(recs, k_max=3)
    assert s.drafted == 9 and s.accepted == 6
    assert s.acceptance == pytest.approx(6 / 9)
    assert s.acceptance_tested == pytest.approx(6 / 8)
    assert s.accept_by_pos == pytest.approx([1.0, 2 / 3, 1 / 3])
    assert s.accept_cond_by_pos == pytest.approx([1.0, 2 / 3, 1 / 2])
    assert s.mean_accepted == pytest.approx(2.0)
    assert s.tokens == 11 and s.decode_tokens == 10
    assert s.tokens_per_step == pytest.approx(10 / 4)
    assert s.ttft_ms == 5 and s.ttlt_ms == 60
    # rejected share: step 1: 1*1/3 + 10*1/4; step 2: 1*2/3 + 10*2/4
    assert s.rejected_ms == pytest.approx(1 / 3 + 2.5 + 2 / 3 + 5.0)


def test_repetition_flags_loops():
    assert repetition(list(range(40))) == 0.0
    assert repetition([1, 2, 3, 4, 5] * 8) > 0.8
    assert repetition([1, 2]) is None


def test_spread():
    s = spread([3.0, 1.0, 2.0])
    assert (s["median"], s["min"], s["max"], s["n"]) == (2.0, 1.0, 3.0, 3)
    assert spread([])["median"] is None
