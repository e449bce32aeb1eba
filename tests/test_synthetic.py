"""labkit.artifacts.synthetic: random-weight GGUFs that llama.cpp loads and runs on token ids.

Each model is written once per module, loaded in the real engine and decoded: a
prefill of random ids, then verifies of m = 1..4 rows, all logits finite.
"""

from __future__ import annotations

import hashlib

import numpy as np
import pytest

from labkit.artifacts import synthetic, zoo
from labkit.engines.llamacpp import LlamaCppEngine

NAMES = ["synthetic-dense", "synthetic-moe", "synthetic-mtp"]


def sha256(path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


@pytest.fixture(scope="module")
def written(tmp_path_factory):
    d = tmp_path_factory.mktemp("synthetic")
    return {n: (d / f"{n}.gguf", synthetic.write(n, d / f"{n}.gguf")) for n in NAMES}


@pytest.mark.parametrize("name", NAMES)
def test_loads_and_decodes_token_ids(written, name):
    path, made = written[name]
    cfg = synthetic.config_for(name)
    with LlamaCppEngine(path, n_ctx=256, n_threads=1, load_mtp=name == "synthetic-mtp", artifact=made) as e:
        assert e.n_vocab == cfg["n_vocab"]
        assert e._lc.llama_model_n_layer(e.model) == cfg["n_layer"]
        assert e._lc.llama_model_n_layer_nextn(e.model) == cfg.get("n_nextn", 0)
        rng = np.random.default_rng(0)
        e.decode(rng.integers(0, e.n_vocab, 16).tolist(), all_logits=False)
        assert np.isfinite(e.logits(-1)).all()
        assert e.logits(-1).std() > 0.01  # not a degenerate (all-equal) output layer
        for m in range(1, 5):
            base = e.n_past
            e.decode(rng.integers(0, e.n_vocab, m).tolist())
            rows = np.stack([e.logits(i) for i in range(m)])
            assert rows.shape == (m, e.n_vocab) and np.isfinite(rows).all()
            e.rollback(base)
        assert e.n_past == 16


def test_same_config_same_bytes(written, tmp_path):
    for name in ["synthetic-dense", "synthetic-mtp"]:
        again = tmp_path / f"{name}.gguf"
        synthetic.write(name, again)
        assert sha256(again) == sha256(written[name][0]), name


def test_made_is_labelled_synthetic(written):
    for name, (path, made) in written.items():
        assert made["synthetic"] is True
        assert "SYNTHETIC" in made["label"] and "cost only" in made["label"]
        assert made["config"] == synthetic.config_for(name)
        assert 0 < made["tensor_bytes"] <= path.stat().st_size


def test_moe_matches_dense_active_parameters(written):
    dense, moe = written["synthetic-dense"][1], written["synthetic-moe"][1]
    for key in ["n_embd", "n_layer", "n_vocab", "n_ff"]:
        assert dense[key] == moe[key], key
    # top-2 experts of n_ff/2 hold exactly the dense FFN's weights; the MoE adds only its router
    assert moe["experts"] == {"count": 8, "used": 2, "n_ff_expert": dense["n_ff"] // 2, "shared": 0}
    assert moe["active_ffn_params"] == dense["active_ffn_params"]
    assert moe["active_ffn_bytes"] == dense["active_ffn_bytes"]
    assert moe["active_params"] == dense["active_params"] + moe["router_params"]
    assert moe["total_params"] > 2.5 * dense["total_params"]
    assert dense["extra_row_expert_bytes_max"] == 0
    assert moe["extra_row_expert_bytes_max"] == moe["n_layer"] * 2 * moe["expert_bytes"]
    assert moe["expert_bytes"] == 3 * moe["n_embd"] * moe["experts"]["n_ff_expert"] // 32 * 18  # Q4_0


def test_mtp_model_shape(written):
    made = written["synthetic-mtp"][1]
    assert made["architecture"] == "glm4moe" and made["nextn_layers"] == 1
    assert made["experts"]["shared"] == 1
    assert made["nextn_params"] > 0
    assert made["total_params"] < 10_000_000  # a few MB


def test_zoo_builds_and_reuses_synthetic(monkeypatch, tmp_path):
    monkeypatch.setenv("LABKIT_CACHE", str(tmp_path))
    art = zoo.get("synthetic-mtp")
    assert art.synthetic and art.kind == "synthetic"
    assert art.made["config"] == synthetic.config_for("synthetic-mtp")
    assert art.sha256 == sha256(art.path)
    assert "SYNTHETIC" in art.describe()["label"]
    assert zoo.get("synthetic-mtp").sha256 == art.sha256  # reused from the cache
    assert zoo.get("synthetic-mtp", rebuild=True).sha256 == art.sha256  # rebuilt: same bytes


def test_unknown_name_is_a_clear_error():
    from labkit.errors import LabkitError

    with pytest.raises(LabkitError, match="unknown synthetic model"):
        synthetic.config_for("synthetic-nope")
