"""Replay: the accept pattern of greedy speculation at any k from one plain run.

First on a constructed stream (each step checkable by hand), then the claim itself on the
real engine: the replayed steps equal the measured speculative runs step by step
(drafted, accepted, per-position outcomes, emitted tokens) on real prompts, for several
k, with the n-gram drafter and with a real greedy draft model.
"""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from labkit.analysis import replay as rp
from labkit.decoding.drafters.base import Draft, Drafter

PROMPT = [1, 2]
STREAM = [10, 11, 12, 13, 14, 15, 16, 17]


class Spoiled(Drafter):
    """Proposes the known continuation, with the token at output position ``bad`` wrong."""

    def __init__(self, stream, bad=4):
        self.stream, self.bad, self.begun = stream, bad, 0

    def begin(self, prompt, *, keep=0):
        self.begun += 1

    def propose(self, history, k, *, temperature=0.0, rng=None):
        i = len(history) - len(PROMPT)
        return Draft([99 if j == self.bad else self.stream[j] for j in range(i, min(i + k, len(self.stream) + 2))])


def pattern(steps):
    return [(s["k"], s["drafted"], s["accepted"], s["outcomes"], s["tokens"]) for s in steps if s["mode"] == "spec"]


def test_replay_steps_by_hand():
    d = Spoiled(STREAM)
    steps = rp.replay(PROMPT, STREAM, d, 2, max_tokens=8)
    assert d.begun == 1 and steps[0]["mode"] == "prefill" and steps[0]["tokens"] == [10]
    assert pattern(steps) == [(2, 2, 2, [1, 1], [11, 12, 13]),  # both accepted + the target's bonus token
                              (2, 2, 0, [0, -1], [14]),  # position 4 spoiled: the target's own token
                              (2, 2, 2, [1, 1], [15, 16, 17])]
    s = rp.summarize_replay(steps, 2)
    assert (s["drafted"], s["accepted"], s["steps"]) == (6, 4, 3)
    assert s["first_token_acceptance"] == pytest.approx(2 / 3) and s["acc_pos"] == [2, 2]


def test_replay_never_drafts_past_max_tokens():
    steps = rp.replay(PROMPT, STREAM, Spoiled(STREAM), 4, max_tokens=8)
    assert pattern(steps) == [(4, 4, 3, [1, 1, 1, 0], [11, 12, 13, 14]),
                              (3, 3, 3, [1, 1, 1], [15, 16, 17])]  # k clipped to max_tokens - emitted


def test_a_draft_through_a_stop_token_is_a_lower_bound():
    plain = STREAM[:6]  # the plain run stopped on its 6th token (an end-of-generation token)
    steps = rp.replay(PROMPT, plain, Spoiled(STREAM, bad=99), 3, max_tokens=8)
    last = steps[-1]
    assert last["tokens"] == [15] and last["accepted"] == 1 and last["outcomes"] == [1, -1, -1]
    assert not last["exact"]  # the real loop would also test 16 against what follows the stop token
    assert not rp.summarize_replay(steps, 3)["exact"]
    assert all(s["exact"] for s in steps[:-1])


def test_prediction_prices_each_replayed_step():
    steps = rp.replay(PROMPT, STREAM, Spoiled(STREAM), 2, max_tokens=8)
    for s in steps:
        s["draft_ms"] = 1.0

    def V(m):
        return 10.0 + 2.0 * (np.asarray(m) - 1)

    p = rp.predict_run(steps, V=V, H=10.0, overhead=(0.5, 0.0), prefill_ms=20.0)
    # 3 decode steps, each: draft 1 + V(3) = 14 + o 0.5 -> 46.5 ms; plain: 7 tokens x 10.5 ms
    assert p["pred_decode_ms"] == pytest.approx(46.5)
    assert p["pred_plain_decode_ms"] == pytest.approx(73.5)
    assert p["pred_e2e_speedup"] == pytest.approx((20 + 73.5) / (20 + 1.0 + 46.5))  # + the drafter's begin
    table = rp.prediction_table([{"drafter": "x", "workload": "w", "prompt": "p", "k": 2, "steps": steps,
                                  "prefill_ms": 20.0}], V=V, H=10.0, overhead=(0.5, 0.0))
    by_k = rp.prediction_by_k(table)
    assert by_k.iloc[0]["pred_acceptance"] == pytest.approx(4 / 6) and by_k.iloc[0]["k"] == 2
    # the prediction's spread over prompts (here one prompt: no interval; two prompts by hand below)
    two = pd.concat([table, table.assign(prompt="q", pred_e2e_speedup=table["pred_e2e_speedup"] * 1.21)])
    row = rp.prediction_by_k(two).iloc[0]
    assert row["pred_e2e_gm"] == pytest.approx(table["pred_e2e_speedup"].iloc[0] * 1.1)  # geometric mean
    assert row["pred_e2e_lo"] < row["pred_e2e_gm"] < row["pred_e2e_hi"]
    assert row["pred_e2e_verdict"] in ("wins", "loses", "no measurable difference")


def test_the_planner_reads_acceptance_by_position_from_a_replay():
    """``plan --acceptance replay:LAB:…``: the replay-prediction table's positions, by hand.
    k=2: 3 steps, position 1 accepted twice, position 2 twice -> (2/3, 2/3); the k=1
    replay of the same stream is ignored (the largest k replayed is read)."""
    from labkit.errors import LabkitError
    from labkit.report.plan_tables import acceptance_from_replay_rows

    rows = [{"drafter": "x", "workload": "w", "prompt": "p", "k": k, "steps": rp.replay(PROMPT, STREAM, Spoiled(STREAM), k,
                                                                                        max_tokens=8)} for k in (1, 2)]
    table = rp.prediction_table(rows, V=lambda m: 10.0 * np.asarray(m), H=10.0)
    assert table[table["k"] == 2]["pred_acc_pos"].iloc[0] == [2, 2]
    acc = acceptance_from_replay_rows(table, drafter="x", source="LAB:02-aaaaaa-bbbbb")
    assert acc["p"] == pytest.approx([2 / 3, 2 / 3]) and acc["k_max"] == 2 and acc["steps"] == 3
    assert acc["source"] == "replay of LAB:02-aaaaaa-bbbbb"
    with pytest.raises(LabkitError, match="replayed no ngram drafts"):
        acceptance_from_replay_rows(table, drafter="ngram")
    with pytest.raises(LabkitError, match="rerun 02_k_sweep"):
        acceptance_from_replay_rows(table.drop(columns=["pred_acc_pos"]), drafter="x")


# -- the claim, on the real engine -----------------------------------------------------
MAX_TOKENS = 24


@pytest.fixture(scope="module")
def prompts(engine):
    from labkit.suites.workloads import load_workload

    return [engine.tokenize(p.text) for p in (load_workload("edit", limit=1) + load_workload("code", limit=1))]


def measured_vs_replayed(engine, ids, drafter, k):
    from labkit.decoding.loop import run, tokens_of

    plain = tokens_of(run(engine, ids, k=0, max_tokens=MAX_TOKENS))
    spec = run(engine, ids, drafter=drafter, k=k, max_tokens=MAX_TOKENS)
    assert tokens_of(spec) == plain, "greedy speculation diverged from plain: the replay's premise fails here"
    measured = [(r.k, r.drafted, r.accepted, r.outcomes, r.tokens) for r in spec if r.mode != "prefill"]
    replayed = rp.replay(ids, plain, drafter, k, max_tokens=MAX_TOKENS)
    return measured, pattern(replayed), replayed


@pytest.mark.parametrize("k", [1, 3, 5])
@pytest.mark.slow
def test_replay_equals_measured_ngram_runs_step_by_step(engine, prompts, k):
    from labkit.decoding.drafters.ngram import NgramDrafter

    accepted = 0
    for ids in prompts:
        measured, replayed, steps = measured_vs_replayed(engine, ids, NgramDrafter(), k)
        assert replayed == measured
        accepted += sum(s["accepted"] for s in steps)
    assert accepted > 0  # the edit prompt copies: the comparison covers accepted drafts, not only misses


@pytest.mark.slow
def test_replay_equals_measured_draft_model_runs(engine, draft_engine, prompts):
    from labkit.decoding.drafters.model import ModelDrafter

    d = ModelDrafter(draft_engine, target=engine)
    measured, replayed, steps = measured_vs_replayed(engine, prompts[0], d, 2)
    assert replayed == measured and sum(s["accepted"] for s in steps) > 0


@pytest.mark.slow
def test_prediction_computes_a_draft_models_prompt_once_for_every_k(engine, draft_engine, prompts):
    """``measure.protocol.predict`` replays k = 1, 2, 3 with one draft model: its prompt is
    computed once (at k = 1) and reused, the replayed steps are those of replays that each
    compute it afresh, and every k is priced with the begin time measured at k = 1.
    The prices (V, H) are SYNTHETIC: only the patterns and the begin times are checked."""
    from types import SimpleNamespace

    from labkit.decoding.drafters.model import ModelDrafter
    from labkit.decoding.loop import run, tokens_of
    from labkit.measure import protocol as mp

    d = ModelDrafter(draft_engine, target=engine)
    ids = list(prompts[0])
    prefills, inside = [], []
    real_decode, real_prefill = draft_engine.decode, draft_engine.prefill

    def decode(tokens, **kw):
        if inside:
            prefills[-1] += len(tokens)
        return real_decode(tokens, **kw)

    def prefill(prompt, **kw):
        prefills.append(0)
        inside.append(1)
        try:
            return real_prefill(prompt, **kw)
        finally:
            inside.pop()

    draft_engine.decode, draft_engine.prefill = decode, prefill
    try:
        pred = mp.predict(engine, [SimpleNamespace(id="p0", workload="w", ids=ids)], drafters={"model": d},
                          ks=[0, 1, 2, 3], max_tokens=MAX_TOKENS, V=lambda m: 20.0 + 0 * m, H=20.0)
    finally:
        del draft_engine.decode, draft_engine.prefill
    assert prefills == [len(ids), 0, 0]  # three begins: the prompt computed at k = 1 only
    plain = tokens_of(run(engine, ids, k=0, max_tokens=MAX_TOKENS))
    fresh = rp.replay_sweep(ids, plain, lambda: d, [1, 2, 3], max_tokens=MAX_TOKENS)  # each k computes it
    got = {r["k"]: r["steps"] for r in pred["replays"]}
    assert sorted(got) == [1, 2, 3]
    for k in (1, 2, 3):
        assert pattern(got[k]) == pattern(fresh[k])
    assert got[2][0]["draft_ms"] == got[3][0]["draft_ms"] == got[1][0]["draft_ms"] > 0
    assert got[2][0]["begin_measured_at_k"] == got[3][0]["begin_measured_at_k"] == 1


class Sure(Spoiled):
    """Spoiled, with n-gram evidence that every drafted token was seen 20 times in 20."""

    def evidence(self, draft):
        return [{"n": 4, "seen": 20, "total": 20}] * len(draft.tokens)


class Curve:
    """SYNTHETIC verify(m): H + slope·(m - 1) ms."""

    def __init__(self, H, slope):
        self.H, self.slope = H, slope

    def V(self, m):
        return self.H + self.slope * (np.asarray(m, dtype=float) - 1)


def test_a_policy_replays_its_choices_and_learns_from_the_outcomes():
    """The replayed policy cuts each draft to its j and learns what happened, as the loop:
    on a nearly free verify it takes every offered token of strong evidence (the by-hand
    steps of the k = 4 replay); where a row costs 1.5 plain steps nothing pays, and every
    step is plain. Either way the emitted tokens are the plain stream."""
    from labkit.decoding.policy import PricedPolicy

    cheap = PricedPolicy(verify=Curve(10.0, 0.5), k_max=4, overhead=(0.0, 0.0))
    steps = rp.replay(PROMPT, STREAM, Sure(STREAM), 99, max_tokens=8, policy=cheap)
    assert pattern(steps) == [(4, 4, 3, [1, 1, 1, 0], [11, 12, 13, 14]),
                              (3, 3, 3, [1, 1, 1], [15, 16, 17])]
    assert [s["policy_j"] for s in steps[1:]] == [4, 3]
    assert [(r["position"], r["tested"], r["accepted"]) for r in cheap.table()] == [
        (0, 2, 2), (1, 2, 2), (2, 2, 2), (3, 1, 0)]  # the rejected fourth is learned too
    dear = PricedPolicy(verify=Curve(10.0, 15.0), k_max=4, overhead=(0.0, 0.0))
    steps = rp.replay(PROMPT, STREAM, Sure(STREAM), 4, max_tokens=8, policy=dear)
    assert [s["mode"] for s in steps[1:]] == ["plain"] * 7 and {s["policy_j"] for s in steps[1:]} == {0}
    assert [t for s in steps for t in s["tokens"]] == STREAM
