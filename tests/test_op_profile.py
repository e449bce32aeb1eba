"""Per-op-class profile of a verify (measure/op_profile.py) on the real engine and model."""

from __future__ import annotations

import pytest

from labkit.engines.llamacpp import LlamaCppEngine
from labkit.measure.op_profile import CLASSES, NodeClock, breakdown, classify, profile_verify


@pytest.mark.parametrize(("name", "op", "cls"), [
    ("result_output", "MUL_MAT", "head"), ("ffn_up-3", "MUL_MAT", "ffn"), ("ffn_gate-0", "MUL_MAT", "ffn"),
    ("Qcur-0", "MUL_MAT", "attn_proj"), ("attn_out-17", "MUL_MAT", "attn_proj"), ("kq-2", "MUL_MAT", "attention"),
    ("__fattn__-4", "FLASH_ATTN_EXT", "attention"), ("Kcur-5", "ROPE", "attention"),
    ("attn_norm-0", "RMS_NORM", "norm"), ("result_norm", "MUL", "norm"), ("ffn_gelu-1", "GELU", "other"),
    ("Qcur-0 (reshaped)", "RESHAPE", None), ("kv-view", "VIEW", None)])
def test_nodes_are_classified_by_name_and_op(name, op, cls):
    assert classify(name, op) == cls


def test_dispatch_is_taken_out_of_every_node_and_the_rest_is_llama_other():
    nodes = [("x (view)", "VIEW", 10_000), ("result_output", "MUL_MAT", 5_010_000), ("ffn_up-0", "MUL_MAT", 30_000)]
    b = breakdown(nodes, wall_ms=6.0, rows_ms=0.2)  # SYNTHETIC node times
    assert b["head"] == pytest.approx(5.0) and b["ffn"] == pytest.approx(0.02)
    assert b["dispatch"] == pytest.approx(0.03) and b["llama_other"] == pytest.approx(0.95)
    assert b["labkit_rows"] == 0.2 and set(b) == set(CLASSES)


def test_a_profile_of_the_real_model_accounts_for_the_decode(embedded):
    clock = NodeClock()
    e = LlamaCppEngine(embedded.path, n_ctx=512, n_threads=2, eval_callback=clock.callback)
    try:
        p = profile_verify(e, clock, m_values=(1, 2), rounds=1, kv_depth=32)
    finally:
        e.close()
    for m in (1, 2):
        row = p["by_m"][m]
        assert row["nodes"] > 100  # 18 layers, every node called back
        parts = sum(row[c] for c in CLASSES if c != "labkit_rows")
        assert parts == pytest.approx(row["wall"], rel=0.02)
        assert row["head"] > 0 and row["ffn"] > 0 and row["attention"] > 0 and min(row.values()) >= 0


def test_the_recipe_profile_is_01s_table_and_figure(embedded):
    """01's cell: the recipe's model on an engine of its own, one row per m in the wide table,
    every class in the long one (the figure's data), and a recipe on MLX has none."""
    import dataclasses

    from labkit.config.recipe import load
    from labkit.measure import op_profile
    from labkit.report import figures

    R = load("default")
    res = op_profile.profile_recipe(R, m_values=(1, 2), rounds=1, kv_depth=32)
    long = op_profile.frame(res)
    t = op_profile.wide(long)
    assert res["model"] == R.model and list(t["m"]) == [1, 2]
    assert list(long["op_class"].drop_duplicates()) == list(CLASSES)
    for m in (1, 2):
        assert t.loc[t["m"] == m, "total_ms"].item() == pytest.approx(sum(res["by_m"][m][c] for c in CLASSES))
    fig, drawn = figures.render("op_profile", long, title="t")
    assert drawn.equals(long[["m", "op_class", "ms"]]) and len(fig.axes[0].patches) == 2 * len(CLASSES)
    assert op_profile.profile_recipe(dataclasses.replace(R, engine="mlx"), m_values=(1,), rounds=1,
                                     kv_depth=32) is None
