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
