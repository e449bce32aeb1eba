"""Verdicts as people read them, on constructed sweep rows (SYNTHETIC numbers, exact)."""

from __future__ import annotations

import pandas as pd

from labkit.analysis import verdicts
from labkit.analysis.sweep_tables import best_k, cell_table


def rows(effects: dict, *, prompts=("a", "b", "c", "d"), rounds=3, jitter=0.01) -> pd.DataFrame:
    """k_sweep-shaped rows: plain at 10 tok/s, the A/A arm and each (drafter, k) at 10 x effect,
    with a small deterministic round-to-round wobble."""
    out = []
    for i, p in enumerate(prompts):
        for r in range(1, rounds + 1):
            wob = 1 + jitter * ((i + r) % 3 - 1)
            common = {"workload": "edit" if i % 2 else "code", "prompt": p, "temperature": 0.0, "run": r,
                      "cold": False, "drafted": 10, "accepted": 8, "steps": 10, "decode_tokens": 20,
                      "spec_steps": 5, "draft_ms": 1.0, "verify_ms": 1.0, "repetition": None, "ttft_ms": 1.0,
                      "ttlt_ms": 2.0, "gate_closed": 0, "lossless": True}
            out.append({**common, "drafter": "none", "k": 0, "e2e_tok_s": 10.0, "decode_tok_s": 10.0})
            out.append({**common, "drafter": "aa", "k": 0, "e2e_tok_s": 10.0 * wob, "decode_tok_s": 10.0 * wob})
            for (d, k), e in effects.items():
                out.append({**common, "drafter": d, "k": k, "e2e_tok_s": 10 * e * wob, "decode_tok_s": 10 * e * wob})
    return pd.DataFrame(out)


def test_aa_tags_say_whether_the_run_can_be_trusted():
    quiet = verdicts.aa_tags(rows({("ngram", 1): 1.2}), temperature=0.0)
    assert quiet["aa.verdict"] == "no measurable difference" and quiet["aa.reliable"] == "true"
    assert quiet["aa.line"].startswith("A/A control (plain vs plain): 1.00× (95% CI")
    noisy = rows({("ngram", 1): 1.2})
    noisy.loc[noisy["drafter"] == "aa", ["e2e_tok_s", "decode_tok_s"]] *= 1.15  # the second plain arm ran faster
    bad = verdicts.aa_tags(noisy, temperature=0.0)
    assert bad["aa.reliable"] == "false" and "box noise" in bad["aa.line"]
    assert verdicts.aa_tags(noisy[noisy["drafter"] != "aa"], temperature=0.0) == {}


def test_forest_table_has_the_aa_row_first_then_each_arm_per_workload_and_pooled():
    f = verdicts.forest_table(rows({("ngram", 1): 1.2, ("ngram", 2): 0.8}))
    assert f.iloc[0]["label"] == "A/A (plain vs plain)"
    assert set(f["workload"]) == {"all", "code", "edit"}
    pooled = f[(f["k"] == 1) & (f["workload"] == "all")].iloc[0]
    assert pooled["verdict"] == "wins" and pooled["lo"] > 1.02 and pooled["basis"] == "end-to-end"
    assert f[(f["k"] == 2) & (f["workload"] == "all")].iloc[0]["verdict"] == "loses"


def test_the_aa_arm_is_no_cell_and_best_k_needs_a_win_after_selection():
    r = rows({("ngram", 1): 1.01, ("ngram", 2): 1.2})
    cells = cell_table(r)
    assert "aa" not in set(cells["drafter"])
    b = best_k(cells, rows=r).set_index("workload")
    assert (b["best_k"] == 2).all() and (b["candidates"] == 2).all() and (b["verdict"] == "wins").all()
    flat = rows({("ngram", 1): 1.01, ("ngram", 2): 1.005})  # inside the ±2% band: the simpler option
    b = best_k(cell_table(flat), rows=flat)
    assert (b["best_k"] == 0).all() and set(b["verdict"]) == {"no measurable difference"}
