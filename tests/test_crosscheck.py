"""labkit vs llama-bench: the agreement verdict tested by simulation against known ratios,
and the real llama-bench of the one build run against the real engine."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from labkit.analysis import crosscheck as xc
from labkit.measure import crosscheck


def _samples(factor: dict[int, float], *, rounds=5, sigma=0.03, seed=0) -> pd.DataFrame:
    """SYNTHETIC samples: llama-bench pp m = 10 + 5m ms, labkit's one-logit decode = factor[m] x that,
    each round's level jittered (lognormal sigma), 5 repetitions per round."""
    rng = np.random.default_rng(seed)
    out = []
    for r in range(rounds):
        for m, f in factor.items():
            base = (10 + 5 * m) * np.exp(rng.normal(0, sigma))
            for _ in range(5):
                out.append({"source": "llama-bench", "test": "pp", "m": m, "logit_rows": 1, "round": r,
                            "ms": base * np.exp(rng.normal(0, 0.01))})
                out.append({"source": "labkit", "test": "pp", "m": m, "logit_rows": 1, "round": r,
                            "ms": f * base * np.exp(rng.normal(0, sigma))})
                out.append({"source": "labkit", "test": "pp", "m": m, "logit_rows": m, "round": r,
                            "ms": f * base * np.exp(rng.normal(0, sigma)) + 2.0 * (m - 1)})
    return pd.DataFrame(out)


@pytest.mark.parametrize("factor, verdict, at_least", [
    (1.00, "agree", 0.95),  # the same work timed twice: agree within ±10%
    (1.30, "disagree", 0.95),  # 30% apart: a finding
    (0.80, "disagree", 0.95),
])
@pytest.mark.slow
def test_agreement_verdict_by_simulation(factor, verdict, at_least):
    hits = [xc.agreement(_samples({2: factor}, seed=s)).query("judged").iloc[0]["verdict"] == verdict
            for s in range(100)]
    assert np.mean(hits) >= at_least


def test_a_ratio_on_the_edge_is_not_called_agreement():
    # true ratio exactly 1.10 with tolerance 0.10: the CI straddles the edge, so never "agree" by luck
    got = [xc.agreement(_samples({2: 1.10}, seed=s)).query("judged").iloc[0]["verdict"] for s in range(100)]
    assert got.count("agree") / 100 <= 0.05 and got.count("undetermined") / 100 >= 0.5


def test_the_output_head_is_listed_unjudged_with_its_cost_per_row():
    t = xc.agreement(_samples({1: 1.0, 4: 1.0}))
    every = t[~t["judged"]].iloc[0]
    assert every["m"] == 4 and every["logit_rows"] == 4 and pd.isna(every["verdict"])
    assert abs(every["extra_ms_per_logit_row"] - 2.0) < 0.5  # the simulated 2 ms per extra logit row


def test_summary_names_where_it_disagrees():
    s = xc.summary(xc.agreement(_samples({1: 1.0, 3: 1.4, 4: 1.0})))
    assert s["verdict"] == "disagree" and "disagree at m=3" in s["line"] and "±10%" in s["line"]
    assert "per extra logit row" in s["line"]


def test_parse_bench_reads_pp_per_batch_and_tg_per_token():
    text = ('[{"n_prompt": 4, "n_gen": 0, "n_depth": 200, "samples_ns": [40000000, 42000000]},'
            ' {"n_prompt": 0, "n_gen": 16, "n_depth": 200, "samples_ns": [320000000]}]')
    df = crosscheck.parse_bench(text)
    assert df[df["test"] == "pp"]["ms"].tolist() == [40.0, 42.0]
    assert df[df["test"] == "tg"]["ms"].tolist() == [20.0]  # 320 ms over 16 tokens


def test_garbage_from_llama_bench_is_a_clear_error():
    from labkit.errors import LabkitError

    with pytest.raises(LabkitError, match="llama-bench printed no JSON"):
        crosscheck.parse_bench("error: unknown argument -zz")


@pytest.mark.slow  # the real llama-bench of the one build, twice
def test_real_llama_bench_against_the_real_engine(engine):
    res = crosscheck.for_engine(engine, m_values=[1, 2], kv_depth=32, rounds=2, reps=2, n_gen=4)
    assert res["skipped"] is None and res["one_build"] is True
    s = res["samples"]
    assert set(s["source"]) == {"labkit", "llama-bench"} and set(s["round"]) == {0, 1}
    assert "-d" in res["command"] and res["command"][res["command"].index("-d") + 1] == "32"
    t = xc.agreement(s)
    judged = t[t["judged"]]
    assert len(judged) == 3  # pp1, pp2 and the plain step
    assert (judged["ratio"] > 0).all() and judged["verdict"].isin(["agree", "disagree", "undetermined"]).all()
    tags = crosscheck.tags(t, res)
    assert tags["crosscheck.verdict"] in ("agree", "disagree", "undetermined") and "llama-bench" in tags["crosscheck.line"]


@pytest.mark.slow  # the real llama-batched-bench of the one build, between labkit's multi-slot rounds
def test_real_batched_bench_runs_between_labkits_rounds(embedded):
    from labkit.analysis import concurrency as ctable
    from labkit.engines.llamacpp import LlamaCppEngine
    from labkit.measure import concurrency
    from labkit.suites.workloads import load_workload

    multi = LlamaCppEngine(embedded.path, n_ctx=512 * 2, n_threads=2, n_seq_max=2, kv_unified=True,
                           artifact=embedded.describe())
    try:
        ids = [multi.tokenize(p.text) for p in load_workload("edit", limit=2)]
        seen = []
        bb = crosscheck.BatchedRounds(embedded.path, cs=[1, 2, 8], prompts=ids, max_tokens=8, threads=2)
        assert bb.cmd[bb.cmd.index("-npl") + 1] == "1,2"  # c above 4 is left out

        def after(r):
            seen.append((r, len(bb.rows)))
            bb(r)

        res = concurrency.bench_concurrency(multi, ids, cs=[1, 2], ks=[0], runs=2, max_tokens=8, after_round=after)
    finally:
        multi.close()
    assert seen == [(0, 0), (1, 1)]  # one batched-bench call after each labkit round, in order
    out = bb.result()
    assert sorted(out["rows"]["round"].unique()) == [0, 1] and set(out["rows"]["pl"]) == {1, 2}
    assert out["order"].startswith("interleaved")
    t = xc.batched_agreement(ctable.table(res), out["rows"])
    assert t["c"].tolist() == [1, 2] and (t["rounds"] == 2).all() and (t["ratio"] > 0).all()


def test_batched_rounds_without_a_round_is_a_clear_error():
    from labkit.errors import LabkitError

    bb = crosscheck.BatchedRounds("m.gguf", cs=[1], prompts=[[1, 2, 3]], max_tokens=4, threads=1, exe="/x/bb",
                                  runner=lambda cmd: "")
    with pytest.raises(LabkitError, match="ran no round"):
        bb.result()


def test_parse_batched_reads_the_json_lines_among_the_log():
    text = ("main: n_kv_max = 2048, n_batch = 2048\n"
            '{"n_kv_max": 2048, "n_batch": 2048, "n_ubatch": 512, "flash_attn": -1, "is_pp_shared": 0, '
            '"n_gpu_layers": 0, "n_threads": 2, "n_threads_batch": 2, "pp": 64, "tg": 32, "pl": 2, "n_kv": 192, '
            '"t_pp": 0.5, "speed_pp": 256.0, "t_tg": 1.0, "speed_tg": 64.0, "t": 1.5, "speed": 128.0}\n')
    df = crosscheck.parse_batched(text)
    assert df.to_dict("records") == [{"pl": 2, "pp": 64, "tg": 32, "speed_tg": 64.0, "speed_pp": 256.0, "t_tg": 1.0}]
    from labkit.errors import LabkitError

    with pytest.raises(LabkitError, match="no result line"):
        crosscheck.parse_batched("error: failed to load model\n")


def test_batched_agreement_pairs_rounds_and_judges_each_c():
    conc = pd.DataFrame([
        {"engine": "labkit", "k": 0, "drafter": "none", "c": 1, "agg_decode_runs": [50.0, 51.0, 49.0]},
        {"engine": "labkit", "k": 0, "drafter": "none", "c": 4, "agg_decode_runs": [130.0, 128.0, 131.0]},
        {"engine": "labkit", "k": 0, "drafter": "aa", "c": 1, "agg_decode_runs": [50.0, 50.0, 50.0]},
        {"engine": "llama-server", "k": 0, "drafter": "none", "c": 1, "agg_decode_runs": None}])
    bench = pd.DataFrame([{"pl": c, "round": r, "speed_tg": v} for c, vals in ((1, [50.5, 50.2, 49.8]),
                                                                               (4, [100.0, 101.0, 99.0]))
                          for r, v in enumerate(vals)])
    t = xc.batched_agreement(conc, bench)
    assert t["c"].tolist() == [1, 4] and t["rounds"].tolist() == [3, 3]
    assert t.set_index("c")["verdict"].to_dict() == {1: "agree", 4: "disagree"}
    assert "c=4 disagree 1.30×" in xc.summary_batched(t)


def test_acceptance_by_position_reads_both_engines_counters():
    conc = pd.DataFrame([
        {"engine": "labkit", "c": 2, "k": 3, "drafter": "ngram", "draft_steps": 10, "accepted_per_pos": [8, 5, 2]},
        {"engine": "llama-server", "c": 2, "k": 3, "drafter": "ngram-simple", "draft_steps": 20,
         "accepted_per_pos": [15, 10, 4]},
        {"engine": "labkit", "c": 2, "k": 0, "drafter": "none", "draft_steps": 0, "accepted_per_pos": []}])
    t = xc.acceptance_by_position(conc)
    assert len(t) == 6 and t["position"].tolist() == [1, 2, 3, 1, 2, 3]
    assert t["rate"].tolist() == [0.8, 0.5, 0.2, 0.75, 0.5, 0.2]
    assert t[t["engine"] == "llama-server"]["source"].iloc[0] == "llama-server /metrics"


def test_llama_server_metrics_text_is_parsed_and_differenced():
    from labkit.measure import serve

    def text(d, a, p):
        return ("# HELP llamacpp:spec_decode_num_drafts_total x\n# TYPE llamacpp:spec_decode_num_drafts_total counter\n"
                f"llamacpp:spec_decode_num_drafts_total {d}\nllamacpp:spec_decode_num_accepted_tokens_total {a}\n"
                "llamacpp:spec_decode_num_draft_tokens_total 99\n"
                + "".join(f'llamacpp:spec_decode_num_accepted_tokens_per_pos_total{{position="{i}"}} {v}\n'
                          for i, v in enumerate(p)))

    before = serve.parse_metrics(text(2, 1, [1]))
    after = serve.parse_metrics(text(12, 9, [7, 2]))
    assert after["drafts"] == 12 and after["per_pos"] == {0: 7.0, 1: 2.0}
    assert serve.metrics_delta(before, after) == {"drafts": 10, "draft_tokens": 0, "accepted": 8, "per_pos": [6, 2]}
    assert serve.metrics_delta(None, None) == {}
