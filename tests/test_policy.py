"""The priced draft length policy: its choice on constructed verify curves and acceptance
streams (SYNTHETIC curves, known answers), its calibration learned online, bad input,
and lossless greedy output on the real engine and model.
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from labkit.analysis import calibration
from labkit.config import runtime
from labkit.config.recipe import from_dict
from labkit.decoding.drafters.base import Draft, Drafter
from labkit.decoding.drafters.ngram import NgramDrafter
from labkit.decoding.loop import run, tokens_of
from labkit.decoding.policy import (
    CELL_CAP,
    Choice,
    PricedPolicy,
    evidence_bin,
    expected_tokens,
    make,
)
from labkit.errors import LabkitError
from labkit.suites.workloads import load_workload


class Curve:
    """SYNTHETIC verify(m): H and V(m) from a table (m = 1 is H)."""

    def __init__(self, H: float, V: dict):
        self.H, self._V = H, {1: H, **V}

    def V(self, m):
        return self._V[int(m)]


def strong(n):  # n-gram evidence that was seen every time, many times
    return [{"n": 4, "seen": 20, "total": 20}] * n


def weak(n):
    return [{"n": 2, "seen": 1, "total": 9}] * n


def pick(policy, evidence, draft_ms=0.0) -> int:
    pred, bins = policy.predict(evidence)
    return policy.choose(Choice(j=0, pred=pred, bins=bins), draft_ms=draft_ms).j


# this box's shape: verify(2) ~ 2H, verify(3) ~ 3.4H, odd m dearer than the next even m
BOX = Curve(10.0, {2: 21.0, 3: 34.0, 4: 27.0, 5: 45.0, 6: 35.0, 7: 52.0, 8: 40.0, 9: 60.0})


def test_one_token_draft_loses_when_verify2_exceeds_2H():
    """E[1] <= 2 tokens for V(2) = 2.1H: j = 1 never pays, however strong its evidence;
    a longer draft at an even m does, when the evidence says >= 2 tokens."""
    pol = PricedPolicy(verify=BOX, k_max=8)
    assert pick(pol, strong(1)) == 0
    assert pick(pol, strong(3)) == 3  # m = 4: 2.7H for ~3.7 expected tokens
    assert pick(pol, weak(3)) == 0


def test_cheap_even_m_makes_a_long_draft_win_on_strong_evidence():
    pol = PricedPolicy(verify=BOX, k_max=8)
    assert pick(pol, strong(8)) == 7  # m = 8 (4H) beats m = 9 (6H) and every odd m
    assert pick(pol, strong(6)) in (3, 5)  # never an odd m when the next even one exists
    assert pick(pol, strong(6)) % 2 == 1  # j odd = m even


def test_weak_evidence_stays_plain_even_on_a_cheap_curve():
    flat = Curve(10.0, {m: 10.5 for m in range(2, 10)})
    pol = PricedPolicy(verify=flat, k_max=8)
    assert pick(pol, [{"n": 2, "seen": 0, "total": 40}] * 4) == 0
    assert pick(pol, strong(4)) == 4  # a nearly free verify takes every strong token


def test_expected_tokens():
    assert np.allclose(expected_tokens([0.5, 0.5]), [1.0, 1.5, 1.75])
    assert evidence_bin({"p": 0.93}) == ("p9", 0.93)
    assert evidence_bin({"n": 3, "seen": 2, "total": 3})[0] == "n3:most"


def test_the_batch_drafts_less_as_it_grows():
    """A shared decode's cost rises with its rows (a + b·rows): what pays for one stream
    (a one-row step costs H) does not for four (SYNTHETIC batch curve)."""
    batch = Curve(10.0, {m: 6.0 + 4.0 * m for m in range(2, 40)})
    pol = PricedPolicy(verify=Curve(10.0, {m: 6.0 + 4.0 * m for m in range(2, 10)}), batch_verify=batch, k_max=4)
    pred, bins = pol.predict([{"n": 4, "seen": 5, "total": 6}] * 4)
    one = pol.choose_batch([Choice(j=0, pred=pred, bins=bins)], draft_ms=[0.0])
    four = pol.choose_batch([Choice(j=0, pred=pred, bins=bins)] * 4, draft_ms=[0.0] * 4)
    assert one[0].j > 0
    assert sum(c.j for c in four) / 4 < one[0].j


def test_learning_from_an_acceptance_stream_stops_drafting_a_bad_bin():
    """A bin whose evidence looks strong but is always rejected is learned and dropped."""
    pol = PricedPolicy(verify=BOX, k_max=8)
    ev = strong(3)
    assert pick(pol, ev) == 3
    for _ in range(40):
        pred, bins = pol.predict(ev)
        pol.observe(Choice(j=3, pred=pred, bins=bins), [0, -1, -1])
    assert pick(pol, ev) == 0
    # 40 outcomes, faded to CELL_CAP's worth once the cell held that many
    assert pol.table()[0]["tested"] == pytest.approx(min(40, CELL_CAP)) and pol.table()[0]["rate"] == 0.0


def test_calibration_matches_a_known_acceptance_stream():
    """Simulated drafts whose true acceptance depends on the evidence bin: after learning
    online, the predictions are within 5 points of what happened in every judged bin."""
    rng = np.random.default_rng(0)
    pol = PricedPolicy(verify=Curve(10.0, {m: 10.0 for m in range(2, 6)}), k_max=4)
    truth = {"n4:all": 0.9, "n2:few": 0.3}
    recs = []
    for step in range(3000):
        ev = strong(4) if step % 2 else [{"n": 2, "seen": 1, "total": 9}] * 4
        pred, bins = pol.predict(ev)
        ch = Choice(j=4, pred=pred, bins=bins)
        out = []
        for b in bins:
            ok = int(rng.random() < truth[b])
            out.append(ok)
            if not ok:
                break
        out += [-1] * (4 - len(out))
        pol.observe(ch, out)
        if step >= 500:  # after a burn-in, as a reader would judge a long run
            recs.append({"policy_pred": pred, "policy_bins": bins, "outcomes": out})
    tab = calibration.table(calibration.samples(recs, drafter="ngram"), by=["drafter"])
    judged = tab[tab["enough"]]
    assert len(judged) >= 2 and judged["within"].all(), tab
    assert calibration.verdict(tab).startswith("within 5 points")
    # a policy that never learned: it says 0.9 where 30% are accepted
    stale = [{"policy_pred": [0.9], "policy_bins": ["n2:few"], "outcomes": [int(i % 10 < 3)]} for i in range(50)]
    bad = calibration.table(calibration.samples(stale))
    assert not bad["within"].any() and abs(bad["gap_pts"].iloc[0] + 60) < 1e-9
    assert calibration.verdict(bad).startswith("not within 5 points in 1 of 1 bins")


class Told(Drafter):
    """SYNTHETIC: a drafter whose evidence for the next proposal is set by the test."""

    name = "told"

    def __init__(self):
        self.ev: list[dict] = []

    def propose(self, history, k, *, temperature=0.0, rng=None):
        return Draft([0] * k)

    def evidence(self, draft):
        return self.ev[: len(draft.tokens)]


def drafted(pol, drafter, ev, truth, rng, j=None):
    """One step: assess, choose (or force j), draw each position's outcome from truth(i, context)."""
    drafter.ev = ev
    c = pol.assess(drafter, drafter.propose([], len(ev)))
    c = pol.choose(c) if j is None else replace(c, j=j)
    out = []
    for i in range(c.j):
        ok = int(rng.random() < truth(i, c.context))
        out.append(ok)
        if not ok:
            break
    out += [-1] * (c.j - len(out))
    pol.observe(c, out)
    return c, out


def test_a_change_of_workload_is_followed_within_a_few_cell_caps():
    """A bin right 95% of the time for 400 steps, then 30% (a new workload): its counts fade
    past CELL_CAP, so after 300 steps of the new workload the table says ~0.3; counting
    every outcome for ever it would still say (400·0.95 + 300·0.3)/700 = 0.67."""
    rng = np.random.default_rng(1)
    pol = PricedPolicy(verify=BOX, k_max=2)
    ev = [{"n": 3, "seen": 2, "total": 3}]
    for truth in [0.95] * 400 + [0.3] * 300:
        pred, bins = pol.predict(ev)  # Choice without raw: the tables alone, no recalibration
        pol.observe(Choice(j=1, pred=pred, bins=bins), [int(rng.random() < truth)])
    assert pol.predict(ev)[0][0] < 0.4
    assert pol.table()[0]["tested"] == pytest.approx(CELL_CAP)


def test_the_same_evidence_is_worth_more_inside_a_run_of_accepted_drafts():
    """SYNTHETIC stream: one evidence bin, accepted 95% of the time right after a fully
    accepted step (inside a copied span) and 30% after a rejection. The policy keeps the
    stream's last drafted step and learns the bin per context: it predicts each within
    8 points, where one rate for both would sit near their mix."""
    rng = np.random.default_rng(2)
    pol, d = PricedPolicy(verify=BOX, k_max=2), Told()
    ev = [{"n": 3, "seen": 2, "total": 3}] * 2
    for _ in range(1500):
        drafted(pol, d, ev, lambda i, ctx: 0.95 if ctx == "hot" else 0.3, rng, j=1)
    hot, cold = pol.predict(ev, "hot")[0][0], pol.predict(ev, "cold")[0][0]
    assert abs(hot - 0.95) < 0.08 and abs(cold - 0.3) < 0.08, (hot, cold)
    d.ev = ev  # and assess reads this stream's own context
    c = pol.assess(d, d.propose([], 2))
    assert c.context in ("hot", "cold") and c.pred[0] == pytest.approx(pol.predict(ev, c.context)[0][0])


def test_recalibration_takes_out_a_bias_that_follows_the_evidence():
    """SYNTHETIC: n-gram evidence that says nothing on this workload (every draft is
    accepted half the time, whatever its support). A bin's prediction starts between its
    support's prior and the position's rate, so strong support over-predicts and weak
    support under-predicts until each of the many thin bins has its own outcomes; the
    recalibration learns the error per tenth of the prediction from all bins at once,
    so over the first 400 steps its predictions are nearer the truth."""

    def mean_abs_gap(recal: bool) -> float:
        rng = np.random.default_rng(3)
        pol, d = PricedPolicy(verify=BOX, k_max=8), Told()
        gaps = []
        for _ in range(400):
            ev = []
            for _ in range(8):
                total = int(rng.integers(1, 6))
                ev.append({"n": int(rng.integers(2, 5)), "seen": int(rng.integers(0, total + 1)), "total": total})
            d.ev = ev
            c = replace(pol.assess(d, d.propose([], 8)), j=4)
            if not recal:  # the tables' own prediction, and nothing learned by the recalibration
                c = replace(c, pred=c.raw, raw=None)
            out = []
            for i in range(4):
                gaps.append(abs(c.pred[i] - 0.5))
                out.append(int(rng.random() < 0.5))
                if not out[-1]:
                    break
            pol.observe(c, out + [-1] * (4 - len(out)))
        return float(np.mean(gaps))

    with_recal, without = mean_abs_gap(True), mean_abs_gap(False)
    assert with_recal < 0.75 * without, (with_recal, without)


def test_calibration_figure_draws():
    from labkit.report import figures

    recs = [{"policy_pred": [0.8, 0.6], "policy_bins": ["a", "b"], "outcomes": [1, 0]}] * 40
    tab = calibration.table(calibration.samples(recs, drafter="ngram"), by=["drafter"])
    fig, drawn = figures.render("calibration", tab)
    assert len(drawn) == 2
    import matplotlib.pyplot as plt

    plt.close(fig)


def test_ngram_evidence_reads_the_index_without_changing_the_proposal():
    h = [1, 2, 3, 9, 1, 2, 3, 9, 1, 2, 3, 7, 5, 1, 2, 3]
    d = NgramDrafter(n_min=2, n_max=3)
    d.begin(h)
    draft = d.propose(h, 3)
    assert draft.tokens == [7, 5, 1] and draft.info["ngram"] == 3  # the most recent continuation
    ev = d.evidence(draft)
    assert ev[0] == {"n": 3, "seen": 1, "total": 3}  # (1,2,3) seen 3 times, once followed by 7
    assert ev[1] == {"n": 3, "seen": 1, "total": 1}  # (2,3,7) -> 5
    assert NgramDrafter(n_min=2, n_max=3).propose(h, 3).tokens == draft.tokens


# -- bad input -------------------------------------------------------------------------
def test_bad_input():
    with pytest.raises(LabkitError, match="k_max"):
        PricedPolicy(verify=BOX, k_max=0)
    with pytest.raises(LabkitError, match="no verify model"):
        PricedPolicy(verify=None, k_max=2)
    with pytest.raises(LabkitError, match="policy_k_max"):
        from_dict({"k": "auto", "policy_k_max": 0})
    with pytest.raises(LabkitError, match="unknown policy"):
        from_dict({"policy": "psychic"})
    r = from_dict({"k": "auto"})
    with pytest.raises(LabkitError, match="bench spec --k auto") as e:
        runtime.make_policy(r, NgramDrafter(), verify=None)
    assert "policy_verify" in e.value.problem


def test_verify_model_must_reach_k_max_plus_one():
    import pandas as pd

    from labkit.analysis import costmodel

    df = pd.DataFrame([(m, 10.0 + 5 * m) for m in range(1, 6) for _ in range(3)], columns=["m", "ms"])
    vm = costmodel.fit_verify_model(df)
    with pytest.raises(LabkitError, match="up to m = 5") as e:
        PricedPolicy(verify=vm, k_max=8)
    assert "policy_k_max to 4" in e.value.fix
    PricedPolicy(verify=vm, k_max=4)


def test_recipe_k_auto():
    r = from_dict({"k": [0, 1, 2, "auto"]})
    assert r.k == [0, 1, 2] and r.policy == "priced" and r.policy_k_max == 8
    assert from_dict({"k": "auto"}).k == [0]
    assert from_dict({}).hash == from_dict({"policy_k_max": 8}).hash  # no policy: the hash is as before
    assert from_dict({"k": "auto"}).hash != from_dict({"k": [0]}).hash


def test_a_loop_refuses_a_gate_beside_the_policy(engine):
    from labkit.decoding.gate import AcceptanceGate

    pol = PricedPolicy(verify=BOX, k_max=4)
    with pytest.raises(LabkitError, match="gate"):
        run(engine, [1, 2, 3], drafter=NgramDrafter(), policy=pol, gate=AcceptanceGate())
    with pytest.raises(LabkitError, match="k_max"):
        run(engine, [1, 2, 3], drafter=NgramDrafter(), policy=pol, k=2)


def test_mtp_policy_on_a_model_without_nextn_layers(engine):
    with pytest.raises(LabkitError, match="nextn") as e:
        runtime.make_drafter("mtp", from_dict({"k": "auto", "drafters": ["mtp"]}), engine)
    assert e.value.fix


# -- the real engine -------------------------------------------------------------------
class Echo(Drafter):
    """Drafts the target's own plain greedy continuation (known in advance), with a
    probability: every draft is accepted, so a policy trusting it drafts long."""

    name = "echo"

    def __init__(self, plain_tokens, prompt_len):
        self.plain, self.n0 = plain_tokens, prompt_len

    def propose(self, history, k, *, temperature=0.0, rng=None):
        i = len(history) - self.n0
        return Draft(list(self.plain[i : i + k]), info={"p": [0.97] * k})


@pytest.mark.slow
@pytest.mark.parametrize("workload", ["edit", "code"])
def test_priced_policy_is_lossless_on_the_real_engine(engine, workload):
    from tests.test_loop import assert_lossless

    ids = engine.tokenize(load_workload(workload)[0].text)
    plain = run(engine, ids, max_tokens=48)
    flat = Curve(25.0, {m: 26.0 for m in range(2, 10)})  # SYNTHETIC: verify nearly free, so it drafts
    pol = make("priced", k_max=6, drafter=(d := NgramDrafter()), verify=flat)
    recs = run(engine, ids, drafter=d, policy=pol, max_tokens=48)
    assert_lossless(engine, ids, plain, recs)
    steps = recs[1:]
    assert all(r.policy_j == r.drafted and len(r.policy_pred) == r.drafted for r in steps)
    assert sum(r.drafted for r in steps) > 0
    assert len({r.policy_j for r in steps}) > 1  # it really chose per step


@pytest.mark.slow
def test_priced_policy_on_the_measured_box_drafts_long_when_every_draft_is_right(engine):
    """With this box's measured verify(m) and a drafter that is always right, the policy
    drafts (and keeps the output); the learned table says every drafted position was accepted."""
    from labkit.analysis import costmodel
    from labkit.measure import verify_cost

    ids = engine.tokenize(load_workload("edit")[0].text)
    plain = run(engine, ids, max_tokens=40)
    vm = costmodel.fit_verify_model(costmodel.verify_frame(
        verify_cost.bench_verify(engine, m_values=range(1, 8), rounds=4, kv_depth=200)))
    d = Echo(tokens_of(plain), len(ids))
    pol = make("priced", k_max=6, drafter=d, verify=vm)
    recs = run(engine, ids, drafter=d, policy=pol, max_tokens=40)
    from tests.test_loop import assert_lossless

    assert_lossless(engine, ids, plain, recs)  # identical, or a near-tie the oracle explains
    drafted, accepted = sum(r.drafted for r in recs), sum(r.accepted for r in recs)
    assert drafted > 20 and accepted >= 0.9 * drafted, (drafted, accepted)
    assert max(r.policy_j for r in recs[1:]) >= 2, ([r.policy_j for r in recs], pol.describe())


@pytest.mark.slow
def test_sampled_run_uses_the_standard_rule_and_is_reproducible(engine):
    ids = engine.tokenize(load_workload("edit")[0].text)
    flat = Curve(25.0, {m: 26.0 for m in range(2, 10)})

    def go():
        d = NgramDrafter()
        return run(engine, ids, drafter=d, policy=make("priced", k_max=4, drafter=d, verify=flat), max_tokens=32,
                   temperature=0.8, seed=3)

    a, b = go(), go()
    assert tokens_of(a) == tokens_of(b)
    assert sum(r.drafted for r in a) > 0


@pytest.mark.slow
def test_multislot_policy_streams_match_their_plain_output(embedded, engine):
    from labkit.analysis.lossless import divergence_report
    from labkit.decoding.multislot import Request, by_stream, run_many
    from labkit.engines.llamacpp import LlamaCppEngine

    multi = LlamaCppEngine(embedded.path, n_ctx=1024, n_threads=2, n_seq_max=2, kv_unified=True,
                           artifact=embedded.describe())
    try:
        prompts = [multi.tokenize(p.text) for p in load_workload("edit", limit=2)]
        refs = [run(engine, p, max_tokens=24) for p in prompts]
        flat = Curve(25.0, {m: 26.0 for m in range(2, 12)})
        pol = PricedPolicy(verify=flat, batch_verify=flat, k_max=4)
        recs = run_many(multi, [Request(prompt=p, max_tokens=24) for p in prompts], c=2, policy=pol,
                        make_drafter=NgramDrafter)
        for i, srecs in by_stream(recs).items():
            assert divergence_report(engine, prompts[i], refs[i], srecs)["lossless"]
        steps = [r for r in recs if r.batch_step >= 0]
        assert all(r.policy_j == r.drafted for r in steps) and sum(r.drafted for r in steps) > 0
    finally:
        multi.close()


def test_policy_summary_maps_to_fixed_server_flags():
    recs = ([{"policy_j": 0, "policy_pred": []}] * 5 + [{"policy_j": 3, "policy_pred": [0.9, 0.8, 0.7]}] * 4
            + [{"policy_j": 7, "policy_pred": [0.95] * 7}])
    s = calibration.policy_summary(recs)
    assert s["j_histogram"] == {0: 5, 3: 4, 7: 1} and s["drafted_share"] == 0.5
    assert s["spec_draft_n_max"] == 7  # 90% of the drafting steps chose j <= 7 (80% chose 3)
    assert 0.7 <= s["spec_draft_p_min"] <= 0.8


@pytest.mark.slow
def test_bench_spec_k_auto_measures_verify_first_and_says_so(capsys, tmp_path):
    import json

    from labkit.commands import bench

    assert bench.main(["spec", "--workload", "edit", "--k", "auto", "--k-max", "4", "--runs", "1",
                       "--max-tokens", "24", "--json"]) == 0
    res = json.loads(capsys.readouterr().out)
    assert res["policy"]["policy"] == "priced" and res["policy"]["k_max"] == 4 and res["k"] == 4
    assert res["policy"]["verify_source"].startswith("measured now: m 1..5")
    assert res["lossless"] is True
    other = tmp_path / "verify.json"
    other.write_text(json.dumps({"kind": "verify", "verify": [], "provenance": {"host": {"hostname": "elsewhere"}}}))
    with pytest.raises(LabkitError, match="not a verify.m. fit of this host"):
        bench.main(["spec", "--workload", "edit", "--k", "auto", "--verify-json", str(other)])


def test_bench_spec_k_auto_without_a_fit_and_policy_verify_error():
    from labkit.commands import bench

    with pytest.raises(LabkitError, match="no verify") as e:
        bench.policy_verify_model(type("A", (), {"verify_json": None})(), from_dict({"policy_verify": "error"}),
                                  None)
    assert "--verify-json" in e.value.fix and "policy_verify: measure" in e.value.fix


def test_exploration_tries_an_untested_bin_until_its_outcomes_say_no():
    """On a verify curve where a prior of 0.75 does not pay (SYNTHETIC, ~linear like one
    thread here), an untried bin is still drafted (optimism) until it has outcomes."""
    lin = Curve(10.0, {m: 9.0 * m for m in range(2, 10)})
    pol = PricedPolicy(verify=lin, k_max=8)
    ev = [{"n": 4, "seen": 1, "total": 1}] * 8

    def choice():
        pred, bins = pol.predict(ev)
        return pol.choose(Choice(j=0, pred=pred, bins=bins, opt=pol.optimistic(pred, bins)))

    assert pick(pol, ev) == 0  # the mean alone would never draft, so never learn
    first = choice()
    assert first.j > 0
    for _ in range(30):
        c = choice()
        if c.j == 0:
            break
        pol.observe(c, [1, 0] + [-1] * (c.j - 2) if c.j >= 2 else [0])
    assert choice().j == 0  # half the first positions rejected: not worth it on this curve
    good = PricedPolicy(verify=BOX, k_max=8)  # this box's shape: a long draft at an even m is cheap
    for _ in range(30):
        pred, bins = good.predict(ev)
        c = good.choose(Choice(j=0, pred=pred, bins=bins, opt=good.optimistic(pred, bins)))
        good.observe(c, [1] * c.j)
    assert c.j >= 7 and good.predict(ev)[0][0] > 0.95  # always right: it drafts long, knowingly


def test_a_deeper_position_borrows_the_running_rate_of_the_one_before():
    pol = PricedPolicy(verify=BOX, k_max=8)
    ev = [{"n": 4, "seen": 1, "total": 1}] * 4
    assert pol.predict(ev)[0][3] == pytest.approx(0.75)
    for _ in range(20):
        pred, bins = pol.predict(ev)
        pol.observe(Choice(j=1, pred=pred, bins=bins), [1])
    assert pol.predict(ev)[0][3] > 0.82  # untried, yet no longer the bare prior


@pytest.mark.slow  # verify(m) measured, then a small sweep with the policy arm, on the real engine
def test_k_auto_is_an_arm_of_the_sweep_judged_like_a_fixed_k(engine):
    from labkit.analysis import sweep_tables, verdicts
    from labkit.measure import policy_arm, sweep

    r = from_dict({"k": [0, 1, "auto"], "drafters": ["ngram"], "policy_k_max": 3, "policy_verify_rounds": 2,
                   "kv_depth": 32})
    arms = {"ngram": runtime.make_drafter("ngram", r, engine)}
    pol = policy_arm.policy_arms(r, engine, arms)
    assert set(policy_arm.arms_only(pol)) == {"ngram+priced"} and pol["_verify_source"].startswith("measured now")
    prompts = load_workload("edit", limit=2)
    rows = sweep.k_sweep(engine, prompts, drafters=arms, ks=[0, 1], policies=pol, runs=2, max_tokens=12)
    p = rows[rows["drafter"] == "ngram+priced"]
    assert len(p) == 2 * 2 and (p["k"] == 3).all() and (p["policy"] == "priced").all()  # 2 warm rounds per prompt
    assert rows[rows["cold"]][["drafter", "k"]].drop_duplicates().values.tolist() == [["none", 0]]  # the cold run: plain
    assert p[p["temperature"] == 0]["lossless"].all()  # the policy never changes a greedy output
    t = verdicts.policy_table(rows)
    assert t["drafter"].tolist() == ["ngram+priced"] and t["k_max"].tolist() == [3]
    assert t["verdict"].iloc[0] in ("wins", "loses", "no measurable difference")
    assert t["e2e_lo"].iloc[0] <= t["e2e"].iloc[0] <= t["e2e_hi"].iloc[0] and "95% CI" in t["line"].iloc[0]
    # what it chose: every step's j in 0..k_max, and the fixed llama-server flags closest to it
    hist = t["j_histogram"].iloc[0]
    assert set(hist) <= {0, 1, 2, 3} and sum(hist.values()) == sum(len(x) for x in p[~p["cold"]]["policy_js"])
    pj = sweep_tables.policy_j_table(p)  # 03's view of the same choices: where each j was chosen
    whole = pj[pj["segment"] == "all"]
    assert dict(zip(whole["j"], whole["steps"], strict=True)) == hist
    assert (pj.groupby("segment")["share"].sum().round(9) == 1).all()
    assert (whole[whole["j"] == 0]["tokens_per_step"] == 1).all() and (whole["tokens_per_step"] <= whole["j"] + 1).all()
    flags = verdicts.llama_server_flags(t)
    assert 0 <= t["spec_draft_n_max"].iloc[0] <= 3
    assert flags.startswith(f"--spec-type ngram-simple --spec-ngram-simple-size-m {t['spec_draft_n_max'].iloc[0]} ")
    # policy_verify: error refuses instead of measuring
    with pytest.raises(LabkitError, match="no verify"):
        policy_arm.policy_arms(from_dict({"k": "auto", "policy_verify": "error"}), engine, arms)
    assert policy_arm.policy_arms(from_dict({"k": [0, 1]}), engine, arms) == {}
