"""The multi-slot loop on the real engine and model: c streams in one llama.cpp context.

Every stream's greedy output must be its own single-stream plain output (or a near-tie
that ``divergence_report`` explains), one stream's rollback must leave the others'
caches alone, and a stream that finishes early must hand its slot to the next request.
"""

from __future__ import annotations

import numpy as np
import pytest

from labkit.analysis import batchcost
from labkit.analysis import concurrency as ctable
from labkit.analysis.lossless import MAX_NEAR_TIE, divergence_report
from labkit.decoding.drafters.ngram import NgramDrafter
from labkit.decoding.loop import run, tokens_of
from labkit.decoding.multislot import Request, by_stream, generate_many, run_many
from labkit.engines.llamacpp import LlamaCppEngine
from labkit.errors import LabkitError
from labkit.measure import concurrency
from labkit.suites.workloads import load_workload

N_SEQ = 4
PER_SEQ = 512


@pytest.fixture(scope="module")
def multi(embedded):
    e = LlamaCppEngine(embedded.path, n_ctx=PER_SEQ * N_SEQ, n_threads=2, n_seq_max=N_SEQ, kv_unified=True,
                       artifact=embedded.describe())
    yield e
    e.close()


@pytest.fixture(scope="module")
def prompts(multi):
    return [multi.tokenize(p.text) for p in load_workload("edit", limit=3)]


@pytest.fixture(scope="module")
def refs(engine, prompts):
    """Each prompt's plain single-stream output on the ordinary one-sequence engine."""
    engine.reset()
    return [run(engine, p, max_tokens=24) for p in prompts]


def test_engine_holds_sequences(multi):
    d = multi.describe()
    assert d["n_seq_max"] == N_SEQ and d["kv_unified"] and d["n_ctx"] == d["n_ctx_total"] == PER_SEQ * N_SEQ


@pytest.mark.parametrize("k", [0, 3])
@pytest.mark.slow
def test_each_stream_is_its_own_single_stream_output(multi, engine, prompts, refs, k):
    reqs = [Request(prompt=p, max_tokens=24) for p in prompts]
    recs = run_many(multi, reqs, c=3, k=k, make_drafter=NgramDrafter if k else None)
    streams = by_stream(recs)
    assert sorted(streams) == [0, 1, 2]
    identical = 0
    for i, srecs in streams.items():
        rep = divergence_report(engine, prompts[i], refs[i], srecs)
        assert rep["lossless"], (i, rep["divergence"])
        identical += rep["identical"]
    assert identical >= 2  # near-ties are rare: most streams match token for token
    shared = [r for r in recs if r.batch_step >= 0]
    assert max(r.batch_streams for r in shared) == 3  # all three really shared a decode
    if k:
        assert sum(r.drafted for r in shared) > 0 and sum(r.accepted for r in shared) > 0
        assert any(r.accepted < r.drafted for r in shared)  # rejections, hence rollbacks, happened
    else:
        assert all(r.m == 1 and r.batch_rows == r.batch_streams for r in shared)


def test_rollback_of_one_stream_leaves_the_others(multi, prompts):
    """Two runs of the same batches on sequences 0 and 1; in the second, sequence 0's junk
    drafts are rolled back before sequence 1 decodes on: sequence 1 must not notice.

    In the unified KV buffer the freed cells change where sequence 1's next cells land,
    and so the order in which attention sums them: logits move by kernel noise (well under
    MAX_NEAR_TIE), the greedy continuation does not. Losing sequence 1's cells would."""
    a, b = prompts[0][:40], prompts[1]
    assert len(a) < len(b)  # the rollback point lies inside sequence 1's positions

    def go(rollback: bool):
        multi.seq_clear()
        multi.seq_prefill(0, a)
        multi.seq_prefill(1, b)
        base0 = multi.seq_n_past[0]
        t = multi.argmax(-1)
        off = multi.decode_seqs([(0, [a[-1], 7, 8, 9]), (1, [t])])
        assert off == [0, 4]
        toks = [int(multi.argmax_rows()[4])]
        if rollback:
            multi.seq_rollback(0, base0 + 1)
            assert multi.seq_n_past == [base0 + 1, len(b) + 1, 0, 0]
        first = None
        for _ in range(6):
            multi.decode_seqs([(1, [toks[-1]])])
            first = np.array(multi.logits(0)) if first is None else first
            toks.append(int(multi.argmax_rows()[0]))
        multi.seq_clear()
        return first, toks

    (kept, kept_toks), (rolled, rolled_toks) = go(False), go(True)
    assert rolled_toks == kept_toks
    assert np.abs(rolled - kept).max() < MAX_NEAR_TIE


@pytest.mark.slow
def test_a_stream_finishing_early_hands_its_slot_to_the_next(multi, engine, prompts, refs):
    lens = [4, 24, 24, 24]
    reqs = [Request(prompt=prompts[i % 3], max_tokens=n) for i, n in enumerate(lens)]
    recs = run_many(multi, reqs, c=2, k=2, make_drafter=NgramDrafter)
    s = by_stream(recs)
    assert [sum(len(r.tokens) for r in s[i]) for i in range(4)] == lens
    slot0, slot1 = s[0][0].slot, s[1][0].slot
    assert slot0 != slot1
    assert s[2][0].slot == slot0  # stream 2 took the slot stream 0 left
    assert s[2][0].t_run_ms < s[1][-1].t_run_ms  # ... while stream 1 was still decoding
    joint = {r.batch_step for r in s[1] if r.batch_step >= 0} & {r.batch_step for r in s[2] if r.batch_step >= 0}
    assert joint  # and they shared decodes
    for i in range(4):
        want = tokens_of(refs[i % 3])[: lens[i]]
        assert divergence_report(engine, prompts[i % 3], want, tokens_of(s[i]))["lossless"], i


def test_refuses_what_it_cannot_do_before_decoding(multi, prompts):
    """Bad requests fail on the first next(), before any stream is admitted (no record)."""
    ok = [Request(prompt=prompts[0], max_tokens=4)]
    too_long = [Request(prompt=prompts[0], max_tokens=PER_SEQ * N_SEQ)]
    for reqs, kw, what in ((ok, {"c": N_SEQ + 1}, "n_seq_max"), (ok, {"c": 1, "k": 2}, "needs a drafter"),
                           (too_long, {"c": 1}, "positions")):
        with pytest.raises(LabkitError, match=what):
            next(generate_many(multi, reqs, **kw))


@pytest.mark.slow
def test_bench_concurrency_rows_and_batch_cost(multi, prompts):
    res = concurrency.bench_concurrency(multi, prompts[:2], cs=[1, 2], ks=[0, 2], make_drafter=NgramDrafter,
                                        runs=1, max_tokens=8)
    rows = {(r["c"], r["k"]): r for r in res["rows"]}
    assert set(rows) == {(1, 0), (1, 2), (2, 0), (2, 2)}
    for (c, k), r in rows.items():
        assert r["lossless"] is True, r["divergences"]
        assert r["agg_tok_s"] > 0 and r["per_stream_tok_s"] > 0
        assert r["ttft_p50_ms"] <= r["ttft_p95_ms"] <= r["ttlt_p95_ms"]
        assert (r["acceptance"] is None) == (k == 0)
        assert 1 <= r["rows_per_step"] <= c * (k + 1)
    assert rows[(1, 0)]["rows_per_step"] == 1 and rows[(2, 0)]["speedup"] == 1.0
    assert rows[(2, 0)]["rows_per_step"] > 1  # two streams shared decodes
    df = ctable.table(res)
    assert list(df.columns[: len(ctable.COLUMNS)]) == ctable.COLUMNS
    vm = batchcost.fit(res["batch_steps"])
    pred = batchcost.predict(res["rows"], vm)
    assert len(pred) == 4 and pred["agg_decode_tok_s_pred"].gt(0).all()
    assert pred["rel_error"].notna().all()


class FlatVerify:
    """SYNTHETIC verify(rows): a verify barely dearer than a plain step at any row count, so
    the policy drafts (its pricing is tested in test_policy; here: the arm's plumbing)."""

    H = 25.0

    def V(self, m):
        return 25.0 if int(m) <= 1 else 26.0


@pytest.mark.slow  # a small concurrency sweep with the policy, A/A and plain arms at c = 1, 2
def test_the_policy_is_an_arm_at_every_c(multi, prompts):
    from labkit.decoding.policy import make

    made = []

    def factory():
        made.append(make("priced", k_max=4, drafter=NgramDrafter(), verify=FlatVerify()))
        return made[-1]

    rounds = []
    res = concurrency.bench_concurrency(multi, prompts[:2], cs=[1, 2], ks=[0], make_drafter=NgramDrafter, runs=2,
                                        max_tokens=16, control=True, policy=("priced", factory, 4),
                                        after_round=rounds.append)
    assert len(made) == 2 and rounds == [0, 1]  # one policy per c, kept across its rounds; a hook per round
    rows = {(r["c"], r["drafter"]): r for r in res["rows"]}
    assert set(rows) == {(c, d) for c in (1, 2) for d in ("none", "aa", "ngram+priced")}
    for c in (1, 2):
        pol = rows[(c, "ngram+priced")]
        assert pol["k"] == 4 and pol["lossless"] is True, pol["divergences"]
        assert sum(pol["policy_j"].values()) > 0 and max(pol["policy_j"]) > 0  # it drafted, per step
        assert 0 < pol["policy_drafting_share"] <= 1 and pol["speedup_pairs"] is not None
    assert set(res["policy"]["describe"]) == {1, 2} and res["policy"]["k_max"] == 4
    v = ctable.verdict(ctable.table(res), 2).iloc[0]
    assert v["drafter"] == "ngram+priced" and v["aa_verdict"] is not None
    with pytest.raises(LabkitError, match="needs a drafter"):
        concurrency.bench_concurrency(multi, prompts[:1], cs=[1], ks=[0], policy=("priced", factory, 4))


def test_dips_and_verdict_from_rows():
    # SYNTHETIC rows: the dip and verdict logic on a hand-made table, not a measurement
    rows = [{"engine": "labkit", "c": c, "k": k, "drafter": "ngram" if k else "none", "agg_tok_s": a,
             "agg_tok_s_min": a - 1, "agg_tok_s_max": a + 1, "speedup": s, "agg_runs": [a - 0.3, a, a + 0.3]}
            for c, k, a, s in [(1, 0, 30, 1.0), (2, 0, 50, 1.0), (3, 0, 40, 1.0), (4, 0, 49.5, 1.0),
                               (1, 3, 45, 1.5), (2, 3, 55, 1.1), (3, 3, 44, 1.1), (4, 3, 45, 0.91)]]
    # the A/A control at c=4: a second plain arm, its rounds a little apart from plain's
    rows.append({"engine": "labkit", "c": 4, "k": 0, "drafter": "aa", "agg_tok_s": 49.6, "agg_tok_s_min": 49,
                 "agg_tok_s_max": 50, "speedup": 1.0, "agg_runs": [49.0, 49.9, 49.6]})
    df = ctable.table({"rows": rows})
    d = ctable.dips(df)
    assert d[["k", "c_from", "c_to", "beyond_noise"]].values.tolist() == [[0, 2, 3, True], [3, 2, 3, True]]
    assert ctable.non_monotonic(df)
    v = ctable.verdict(df, 4)
    assert v.iloc[0]["verdict"] == "loses at c=4" and v.iloc[0]["k"] == 3
    assert v.iloc[0]["hi"] < 0.98 and v.iloc[0]["aa_verdict"] == "no measurable difference"
    assert v.iloc[0]["aa_reliable"] and v.iloc[0]["aa_problem"] is None
    wide = [r if r["drafter"] != "aa" else {**r, "agg_runs": [40.0, 60.0, 49.6]} for r in rows]
    w = ctable.verdict(ctable.table({"rows": wide}), 4).iloc[0]  # plain vs plain swings ±20% by round
    assert w["aa_verdict"] == "no measurable difference" and not w["aa_reliable"]
    assert "wider than ±10%" in w["aa_problem"]
    assert v.iloc[0]["decision"].startswith("ngram k=3 at c=4 (aggregate tok/s, best of 1): 0.91× (95% CI")
    assert ctable.verdict(df, 2).iloc[0]["verdict"] == "speculation pays at c=2"
    assert ctable.verdict(df, 8).iloc[0]["verdict"] == "not measured at c=8"
    # 07 logs every forest row as a metric at step = c, its CI as the range, so the MLflow runs
    # table charts speedup against c and drift compares two runs' intervals
    forest = ctable.forest(df)
    ms = {(m["name"], m["step"]): m for m in ctable.forest_metrics(forest)}
    assert set(ms) == {("speedup_c/labkit.aa", 4)} | {("speedup_c/labkit.ngram.k3", c) for c in (1, 2, 3, 4)}
    row = forest[(forest["c"] == 4) & (forest["drafter"] == "ngram")].iloc[0]
    m = ms[("speedup_c/labkit.ngram.k3", 4)]
    assert (m["value"], m["lo"], m["hi"]) == (row["ratio"], row["lo"], row["hi"]) and m["hi"] < 0.98
    plus = forest.assign(drafter=forest["drafter"].replace("ngram", "ngram+priced"))
    assert {m["name"] for m in ctable.forest_metrics(plus)} >= {"speedup_c/labkit.ngram_priced.k3"}  # MLflow's charset


def test_the_best_of_several_arms_at_c_is_not_a_win_by_selection():
    """07 picks the best k at the production c: with rounds this noisy, a 1.05× best arm is
    no measurable difference, not "pays" (the old rule: best median > 1.0)."""
    rows = [{"engine": "labkit", "c": 4, "k": k, "drafter": "ngram" if k else "none", "agg_tok_s": 50 * m,
             "agg_tok_s_min": 0, "agg_tok_s_max": 0, "speedup": m, "agg_runs": [50 * m * f for f in fs]}
            for k, m, fs in [(0, 1.0, (1.0, 1.0, 1.0)), (1, 0.97, (0.9, 1.05, 0.97)), (2, 1.05, (0.95, 1.15, 1.05))]]
    v = ctable.verdict(ctable.table({"rows": rows}), 4).iloc[0]
    assert v["k"] == 2 and v["arms"] == 2
    assert v["verdict"] == "no measurable difference at c=4" and v["lo"] < 1.0 < v["hi"]
