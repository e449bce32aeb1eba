"""Power runs on this machine: the decode window is measured, energy says why it is unavailable."""

from __future__ import annotations

import pandas as pd
import pytest

from labkit.decoding.drafters.ngram import NgramDrafter
from labkit.measure import energy
from labkit.suites.workloads import load_workload


@pytest.mark.slow
def test_decode_window_on_the_real_engine(engine):
    p = load_workload("edit")[0]
    rows = energy.power_runs(engine, [p], drafter=NgramDrafter(), k=3, runs=1, max_tokens=24, interleave="abba")
    assert list(rows["k"]) == [0, 3, 0]  # the warm-up (plain, once), then round 1 in ABBA's order for it
    assert set(rows["interleave"]) == {"abba"}
    for r in rows.itertuples():
        assert r.tokens == 23  # decode window: the prefill token is outside it
        assert 0 < r.cpu_s_per_token < 1
        if not r.energy_available:
            assert r.energy_reason and r.j_per_token is None  # never estimated
    summ = energy.summary(rows)
    assert set(summ["k"]) == {0, 3} and (summ["runs"] == 1).all()


def test_two_modes_arithmetic():
    summ = pd.DataFrame([
        {"k": 0, "decode_tok_s": 40.0, "cpu_s_per_token": 0.050, "j_per_token": None},
        {"k": 4, "decode_tok_s": 60.0, "cpu_s_per_token": 0.055, "j_per_token": None},
    ])
    m = energy.two_modes(summ)
    assert m["performance_k"] == 4 and m["efficiency_k"] == 0
    assert m["efficiency_metric"] == "cpu_s_per_token" and m["delta_per_token"] == pytest.approx(0.1)
    summ["j_per_token"] = [2.0, 1.5]
    m = energy.two_modes(summ)
    assert m["efficiency_metric"] == "j_per_token" and m["efficiency_k"] == 4
