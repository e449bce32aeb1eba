"""The cost model's arithmetic on constructed data (exact answers known)."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from labkit.analysis import costmodel, sweep_tables


def frame(fn, ms=range(1, 9), reps=6, noise=0.0, seed=0):
    rng = np.random.default_rng(seed)
    return pd.DataFrame([(m, fn(m) + rng.normal(0, noise)) for m in ms for _ in range(reps)], columns=["m", "ms"])


def test_linear_fit_recovers_a_and_b_with_honest_cis():
    fit = costmodel.fit_verify(frame(lambda m: 8.0 + 3.0 * m, noise=0.5))
    assert fit.a == pytest.approx(8.0, abs=0.6) and fit.b == pytest.approx(3.0, abs=0.15)
    assert fit.r2 > 0.95 and fit.n == 48
    # 95% intervals cover the truth about 95% of the time (binomial: 300 fits)
    fits = [costmodel.fit_verify(frame(lambda m: 8.0 + 3.0 * m, noise=0.5, seed=s)) for s in range(300)]
    cover_a = np.mean([f.a_ci[0] < 8.0 < f.a_ci[1] for f in fits])
    cover_b = np.mean([f.b_ci[0] < 3.0 < f.b_ci[1] for f in fits])
    assert 0.90 < cover_a < 0.99 and 0.90 < cover_b < 0.99
    lo, hi = fit.band([1, 8])
    assert (lo < fit.predict([1, 8])).all() and (fit.predict([1, 8]) < hi).all()


def test_parity_term_is_found_where_odd_rows_cost_more():
    df = frame(lambda m: 10.0 + 2.0 * m + (7.0 if m % 2 else 0.0), ms=range(2, 9))
    plain = costmodel.fit_verify(df)
    par = costmodel.fit_verify(df, parity=True)
    assert par.parity == pytest.approx(7.0) and par.b == pytest.approx(2.0) and par.r2 > plain.r2
    assert max(abs(v) for v in par.residual_by_m.values()) < 1e-9


def test_verify_model_keeps_the_one_row_step_apart():
    df = pd.concat([frame(lambda m: 10.0, ms=[1]), frame(lambda m: 20.0 + 2.0 * m, ms=range(2, 9))])
    vm = costmodel.fit_verify_model(df)
    assert vm.H == pytest.approx(10.0)
    assert vm.V([1, 2, 4]).tolist() == pytest.approx([10.0, 24.0, 28.0])


def test_a_staircase_is_priced_at_its_measured_medians_not_at_the_line():
    """Tiled kernels make verify(m) a staircase; a step at m = 9 (the shape measured on the
    Intel box, 2026-12-06) drags a line through every m. Each m measured 3+ times is priced at
    its own median; an m measured fewer times, or never, at the line."""
    truth = {1: 17.4, 2: 20.1, 3: 22.2, 4: 25.0, 5: 28.8, 6: 31.1, 7: 34.7, 8: 40.0, 9: 61.1}
    df = frame(lambda m: truth[m], ms=range(1, 10), reps=16, noise=0.3)
    vm = costmodel.fit_verify_model(df)
    ms = list(range(1, 10))
    assert vm.V(ms) == pytest.approx([truth[m] for m in ms], abs=0.4)
    line = vm.fitted(ms)
    assert line[1] < 0.85 * truth[2] and line[0] == vm.H  # the line: two rows priced below one
    assert float(vm.V(10)) == pytest.approx(float(vm.fitted(10)))  # beyond the bench: the line
    sparse = pd.concat([df[df["m"] != 5], df[df["m"] == 5].head(2)])  # m = 5 seen twice only
    vs = costmodel.fit_verify_model(sparse)
    assert float(vs.V(5)) == pytest.approx(float(vs.fitted(5)))
    assert float(vs.V(6)) == pytest.approx(truth[6], abs=0.4)


def test_expected_step_matches_hand_arithmetic():
    vm = costmodel.VerifyModel(H=10.0, fit=costmodel.LinearFit(a=10.0, b=5.0, a_ci=(0, 0), b_ci=(0, 0), r2=1, n=1))
    # drafts always 2 long, position 0 accepted w.p. 0.5, position 1 (given 0) w.p. 0.5
    prof = {"alpha": [0.5, 0.5], "p_len_ge": [1.0, 1.0], "k_max": 2}
    e = costmodel.expected_step(prof, 2, vm, d=(1.0, 0.5), o=(0.0, 0.0))
    assert e["tokens"] == pytest.approx(1 + 0.5 + 0.25)
    assert e["V_ms"] == pytest.approx(10.0 + 5.0 * 3) and e["D_ms"] == pytest.approx(2.0)
    # no draft available half the time at position 0
    prof2 = {"alpha": [1.0], "p_len_ge": [0.5], "k_max": 1}
    e2 = costmodel.expected_step(prof2, 1, vm, d=(0.0, 0.0), o=(0.0, 0.0))
    assert e2["tokens"] == pytest.approx(1.5) and e2["V_ms"] == pytest.approx(0.5 * 10 + 0.5 * 20)


def test_acceptance_profile_pools_runs_whose_position_arrays_differ_in_length():
    """A search's first round measures k = 4 beside k auto (<= 8): its runs record 8 positions;
    its second round measures k = 4 alone: 4 positions. Both pool into one k = 4 profile."""
    def run(acc, tested, reach, steps):
        return {"drafter": "ngram", "workload": "prose_en", "temperature": 0.0, "k": 4, "cold": False,
                "acc_pos": acc, "tested_pos": tested, "drafts_reaching_pos": reach, "steps": steps}

    rows = pd.DataFrame([run([6, 4, 2, 1, 0, 0, 0, 0], [10, 6, 4, 2, 0, 0, 0, 0], [10, 8, 6, 4, 0, 0, 0, 0], 20),
                         run([4, 2, 1, 1], [10, 4, 2, 1], [10, 10, 8, 6], 20)])
    prof = costmodel.acceptance_profile(rows)[("ngram", "prose_en", 0.0)]
    assert prof["k_max"] == 4
    assert prof["alpha"] == pytest.approx([10 / 20, 6 / 10, 3 / 6, 2 / 3])
    assert prof["p_len_ge"] == pytest.approx([20 / 40, 18 / 40, 14 / 40, 10 / 40])
    # 03's table pools the same runs position by position
    pos = sweep_tables.position_table(rows)
    assert pos["position"].tolist() == [0, 1, 2, 3] and pos["accepted"].tolist() == [10, 6, 3, 2]
    assert pos["tested"].tolist() == [20, 10, 6, 3] and pos["drafts"].tolist() == [20, 18, 14, 10]


def test_diagnosis_names_each_of_the_chapters_ways_to_lose():
    vm = costmodel.VerifyModel(H=10.0, fit=costmodel.LinearFit(a=10.0, b=5.0, a_ci=(0, 0), b_ci=(0, 0), r2=1, n=1))

    def step(tokens, V, D):
        return {"tokens": tokens, "V_ms": V, "D_ms": D, "ms": V + D}

    assert costmodel.diagnose(step(3.0, 20.0, 1.0), 3, vm, 10.0) is None  # 7 ms/token beats H = 10: it wins
    a = costmodel.diagnose(step(1.0, 14.0, 0.5), 3, vm, 10.0)  # cheap step, nothing accepted
    assert a["term"] == "a" and a["terms"] == ["a"] and "acceptance collapse (a) dominates" in a["text"]
    both = costmodel.diagnose(step(1.1, 14.0, 0.5), 3, vm, 10.0)  # either fix alone would make it win
    assert both["terms"] == ["a", "V"] and "ways it loses: acceptance collapse (a), verify explodes (V)" in both["text"]
    v = costmodel.diagnose(step(2.5, 60.0, 0.5), 3, vm, 10.0)  # good acceptance, verify of 4 rows = 6 H
    assert v["term"] == "V" and "V" in v["terms"] and "verify explodes (V)" in v["text"]
    d = costmodel.diagnose(step(2.5, 12.0, 40.0), 3, vm, 10.0)  # a draft model as dear as the target
    assert d["term"] == "D" and "draft not cheap (D)" in d["text"]
    spilled = {"spilled": True, "label": "spilled experts: 6 expert tensors on the host"}
    vs = costmodel.diagnose(step(2.5, 60.0, 0.5), 3, vm, 10.0, residency=spilled)
    assert vs["terms"][-1] == "spill" and "6 expert tensors" in vs["text"]
    assert "spill" not in costmodel.diagnose(step(2.5, 12.0, 40.0), 3, vm, 10.0, residency=spilled)["terms"]
