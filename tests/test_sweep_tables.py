"""The sweep's tables and the decision, on constructed rows: every branch reachable.

The end-to-end notebook test runs one workload and one k, so it can only reach one or two
decisions; these build sweep rows by hand (labelled numbers, not measurements) and check
the arithmetic of cell_table, best_k, global_default, decide and the sweep row itself.
"""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from labkit.analysis import sweep_tables
from labkit.decoding.records import StepRecord
from labkit.measure.sweep import _row
from labkit.report.worksheet import decide


def rows(speed: dict[tuple[str, str, int], list[float]], *, acc=0.5) -> pd.DataFrame:
    """Sweep rows: speed[(drafter, workload, k)] = warm decode tok/s per run (run 1..n);
    each prompt also has a cold run (run 0) that every table must ignore."""
    out = []
    for (d, wl, k), values in speed.items():
        for run, v in enumerate([1e6, *values]):  # run 0 is cold: an absurd value that must not count
            out.append({"workload": wl, "prompt": f"{wl}-0", "drafter": d, "k": k, "temperature": 0.0, "run": run,
                        "cold": run == 0, "decode_tok_s": v, "accepted": 10 * acc * k, "drafted": 10 * k,
                        "steps": 10, "spec_steps": 10 if k else 0, "decode_tokens": 10 + 10 * acc * k,
                        "draft_ms": 1.0 * k, "verify_ms": 20.0, "repetition": 0.1, "ttft_ms": 5.0,
                        "ttlt_ms": 100.0, "gate_closed": 0, "lossless": True})
    return pd.DataFrame(out)


def grid(speedups: dict[tuple[str, int], float], base=10.0, drafter="ngram") -> pd.DataFrame:
    """Cells for workloads x k with the given speedups over a plain baseline."""
    speed = {}
    for (wl, k), s in speedups.items():
        speed[("none", wl, 0)] = [base, base, base]
        speed[(drafter, wl, k)] = [base * s] * 3
    return sweep_tables.cell_table(rows(speed))


def test_cell_table_pairs_runs_and_skips_cold():
    cells = sweep_tables.cell_table(rows({("none", "edit", 0): [10.0, 12.0], ("ngram", "edit", 2): [15.0, 12.0]}))
    c = cells.set_index(["drafter", "k"]).loc[("ngram", 2)]
    assert c["n"] == 2 and c["tok_s"] == 13.5 and (c["tok_s_min"], c["tok_s_max"]) == (12.0, 15.0)
    # speedup pairs run i with plain run i: 15/10 and 12/12
    assert c["speedup"] == pytest.approx(1.25) and (c["speedup_min"], c["speedup_max"]) == (1.0, 1.5)
    assert c["acceptance"] == pytest.approx(0.5)


def test_best_k_and_global_default():
    cells = grid({("edit", 1): 1.2, ("edit", 2): 1.5, ("code", 1): 1.3, ("code", 2): 0.8})
    best = sweep_tables.best_k(cells).set_index("workload")
    assert best.loc["edit", "best_k"] == 2 and best.loc["code", "best_k"] == 1
    g = sweep_tables.global_default(cells).iloc[0]
    # geometric means: k=1 sqrt(1.2*1.3)=1.249, k=2 sqrt(1.5*0.8)=1.095
    assert g["k"] == 1 and g["geomean_speedup"] == pytest.approx(np.sqrt(1.2 * 1.3))
    losing = sweep_tables.best_k(grid({("edit", 1): 0.9, ("edit", 2): 0.7})).iloc[0]
    assert losing["best_k"] == 0 and losing["best_spec_k"] == 1  # disable, but say what was best


@pytest.mark.parametrize("speedups, k_tested, word", [
    ({("edit", 1): 1.3, ("edit", 2): 1.5, ("edit", 3): 1.2, ("code", 1): 1.2, ("code", 2): 1.4, ("code", 3): 1.1},
     [0, 1, 2, 3], "keep"),
    ({("edit", 1): 1.2, ("edit", 2): 1.5, ("code", 1): 1.1, ("code", 2): 1.3}, [0, 1, 2], "widen"),
    ({("edit", 1): 1.2, ("edit", 2): 1.9, ("edit", 3): 1.1, ("code", 1): 0.95, ("code", 2): 0.9,
      ("code", 3): 0.8}, [0, 1, 2, 3], "narrow"),
    ({("edit", 1): 0.9, ("edit", 2): 0.8, ("code", 1): 0.95, ("code", 2): 0.7}, [0, 1, 2], "disable"),
])
def test_decide_reaches_every_decision(speedups, k_tested, word):
    cells = grid(speedups)
    d = decide(cells, None, k_tested)
    assert d["decision"].split(":")[0] == word, d
    if word != "disable":
        assert d["best"]["drafter"] == "ngram" and d["best"]["k"] in k_tested


def test_decide_names_the_losing_term_from_the_cost_model():
    cells = grid({("edit", 1): 0.9, ("edit", 2): 0.8})
    pred = pd.DataFrame([{"drafter": "ngram", "workload": "edit", "k": 1, "temperature": 0.0,
                          "losing_term": "verify V(k+1) dominates"}])
    d = decide(cells, pred, [0, 1, 2])
    assert d["decision"].startswith("disable") and "verify V(k+1) dominates" in d["term"]


def test_sweep_row_counts_positions_from_records():
    def rec(step, mode, outcomes, tokens):
        acc = sum(1 for o in outcomes if o == 1)
        return StepRecord(step=step, mode=mode, k=3, drafted=len(outcomes), accepted=acc, outcomes=outcomes,
                          draft=[0] * len(outcomes), m=len(outcomes) + 1, draft_ms=1.0, verify_ms=10.0,
                          accept_ms=0.5, tokens=tokens, from_draft=[True] * acc + [False], t_ms=10.0 * step)

    recs = [rec(0, "prefill", [], [1]), rec(1, "spec", [1, 1, 0], [2, 3, 4]), rec(2, "spec", [0, -1, -1], [5])]
    r = _row(recs, 3)
    assert r["acc_pos"] == [1, 1, 0] and r["tested_pos"] == [2, 1, 1]
    assert r["drafted"] == 6 and r["accepted"] == 2 and r["decode_tokens"] == 4


def test_gate_comparison_carries_both_verdicts_and_says_where_the_gate_changes_one():
    """SYNTHETIC cells: without the gate ngram k=2 loses on prose (0.8x, steady); with it the gate
    closes and the cell reads no measurable difference. On edit both win."""
    jitter = [1.0, 1.01, 0.99]
    off = sweep_tables.cell_table(rows({("none", "prose", 0): [10, 10, 10], ("ngram", "prose", 2): [8 * j for j in jitter],
                                        ("none", "edit", 0): [10, 10, 10], ("ngram", "edit", 2): [13 * j for j in jitter]}))
    on_rows = rows({("none", "prose", 0): [10, 10, 10], ("ngram", "prose", 2): [10 * j for j in jitter],
                    ("none", "edit", 0): [10, 10, 10], ("ngram", "edit", 2): [13 * j for j in jitter]})
    on_rows.loc[(on_rows["workload"] == "prose") & (on_rows["k"] == 2), "gate_closed"] = 3
    m = sweep_tables.gate_comparison(off, sweep_tables.cell_table(on_rows)).set_index("workload")
    assert m.loc["prose", "verdict_gate_off"] == "loses" and m.loc["prose", "verdict_gate_on"] == "no measurable difference"
    assert m.loc["prose", "verdict_changed"] and m.loc["prose", "gate_fired"]
    assert m.loc["edit", "verdict_gate_off"] == m.loc["edit", "verdict_gate_on"] == "wins"
    assert not m.loc["edit", "verdict_changed"]
    assert m.loc["prose", "speedup_hi_gate_off"] < 1 < m.loc["prose", "speedup_hi_gate_on"]


def test_policy_j_table_says_where_each_j_was_chosen():
    """Constructed policy rows (labelled numbers): one warm run of 8 steps drafting only in
    its second half, and a cold run that must not count."""
    warm = {"drafter": "ngram+priced", "workload": "edit", "cold": False,
            "policy_js": [0, 0, 0, 0, 2, 2, 4, 4], "policy_accepted": [0, 0, 0, 0, 2, 1, 4, 3]}
    cold = {**warm, "cold": True, "policy_js": [8] * 8, "policy_accepted": [8] * 8}
    t = sweep_tables.policy_j_table(pd.DataFrame([warm, cold]))
    a = t[t["segment"] == "all"].set_index("j")
    assert a["steps"].to_dict() == {0: 4, 2: 2, 4: 2} and a["share"].to_dict() == {0: 0.5, 2: 0.25, 4: 0.25}
    assert a["tokens_per_step"].to_dict() == {0: 1.0, 2: 2.5, 4: 4.5}
    first = t[t["segment"] == "1st quarter"]
    assert first["j"].tolist() == [0] and first["steps"].tolist() == [2]
    assert t[t["segment"] == "4th quarter"]["j"].tolist() == [4]
    assert t["segment"].iloc[0] == "all"  # "all" first, then the quarters in order
    assert sweep_tables.policy_j_table(pd.DataFrame([{"drafter": "ngram", "workload": "edit"}])).empty
    assert sweep_tables.policy_j_table(None).empty
    # 03 reads 02's whole logged "policy-runs" table back from the store: plain rows (no policy)
    # sit beside the policy's, their cells NaN (LAB:03-9c2470-6hmtv failed on exactly that)
    from labkit.provenance import frames

    plain = {"drafter": "none", "workload": "edit", "cold": False}
    logged = frames.frame_from_json(frames.frame_to_json(pd.DataFrame([plain, warm, cold])))
    pd.testing.assert_frame_equal(sweep_tables.policy_j_table(logged), t)
