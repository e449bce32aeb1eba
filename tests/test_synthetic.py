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
@pytest.mark.slow
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


# -- the gemma3 test models: the embedded model's tokenizer and layout, tiny random weights ----

GEMMA3 = ["synthetic-gemma3", "synthetic-gemma3-q4_0"]
# embedded -> synthetic dimension: n_embd 640 -> 64, n_head * head_dim 1024 -> 64,
# head_dim = n_head_kv * head_dim 256 -> 32, n_ff 2048 -> 256; the vocabulary stays.
DIM = {640: 64, 1024: 64, 256: 32, 2048: 256, 262144: 262144}


def _block0(f) -> dict:
    return {t.name: t for t in f.tensors if not t.name.startswith("blk.") or t.name.startswith("blk.0.")}


@pytest.fixture(scope="module")
def gemma3():
    """The embedded GGUF and both gemma3 test models (zoo: built once per machine), read."""
    from labkit.artifacts import gguf_meta

    emb = gguf_meta.read(zoo.get(zoo.EMBEDDED).path)
    return emb, {n: (zoo.get(n), gguf_meta.read(zoo.get(n).path)) for n in GEMMA3}


def test_gemma3_has_the_embedded_tokenizer_and_layout(gemma3):
    emb, models = gemma3
    tok = {k: v for k, v in emb.kv.items() if k.startswith("tokenizer.")}
    assert len(tok["tokenizer.ggml.tokens"].value) == 262144
    for name, (_art, g) in models.items():
        assert {k: v for k, v in g.kv.items() if k.startswith("tokenizer.")} == tok, name
        assert {k for k in g.kv if k.startswith("gemma3.")} == {k for k in emb.kv if k.startswith("gemma3.")}
        assert g.get("gemma3.block_count") == 6 and g.get("gemma3.attention.sliding_window") == 16
        assert g.get("gemma3.rope.freq_base") == emb.get("gemma3.rope.freq_base")
        assert g.get("gemma3.attention.layer_norm_rms_epsilon") == emb.get("gemma3.attention.layer_norm_rms_epsilon")
        mine, theirs = _block0(g), _block0(emb)
        assert set(mine) == set(theirs), name
        for t, ref in theirs.items():
            assert mine[t].shape == tuple(DIM[d] for d in ref.shape), t
        assert len(g.tensors) == 1 + 1 + 6 * 13


def test_gemma3_runs_on_llamacpp_with_the_embedded_tokens(engine, gemma3):
    from labkit.suites.workloads import WORKLOADS, load_workload

    for name in GEMMA3:
        art = gemma3[1][name][0]
        with LlamaCppEngine(art.path, n_ctx=512, n_threads=2, artifact=art.describe()) as e:
            assert e.n_vocab == engine.n_vocab == 262144
            assert e._lc.llama_model_n_layer(e.model) == 6
            assert e.vocab_fingerprint() == engine.vocab_fingerprint()
            for w in WORKLOADS:
                text = load_workload(w)[0].text
                assert e.tokenize(text) == engine.tokenize(text), (name, w)
            e.decode(engine.tokenize(load_workload("code")[0].text), all_logits=False)
            row = np.asarray(e.logits(-1))
            assert np.isfinite(row).all() and row.std() > 1.0  # spread logits: few greedy ties


def test_gemma3_draft_is_the_target_requantised(gemma3):
    import gguf

    (_, target), (_, draft) = gemma3[1]["synthetic-gemma3"], gemma3[1]["synthetic-gemma3-q4_0"]
    for a, b in zip(target.tensors, draft.tensors):
        assert a.name == b.name
        if a.name.endswith("norm.weight"):  # norms stay F32 and identical
            assert a.tensor_type == b.tensor_type == gguf.GGMLQuantizationType.F32
            assert np.array_equal(a.data, b.data), a.name
            continue
        assert (a.tensor_type.name, b.tensor_type.name) == ("F32", "Q4_0"), a.name
        d = gguf.quants.dequantize(b.data, b.tensor_type)
        rel = np.sqrt(np.mean((d - a.data) ** 2) / np.mean(a.data**2))
        assert 0.01 < rel < 0.2, (a.name, rel)  # the same draws, rounded to 4 bits


def test_gemma3_made_same_bytes_and_label(gemma3, tmp_path):
    art = gemma3[1]["synthetic-gemma3"][0]
    assert art.synthetic and "SYNTHETIC" in art.describe()["label"]
    assert "never for acceptance" in art.made["label"]
    assert art.made["tokenizer_sha256"] == zoo.get(zoo.EMBEDDED).sha256
    made = synthetic.write("synthetic-gemma3", tmp_path / "g.gguf", tokenizer_gguf=zoo.get(zoo.EMBEDDED).path)
    assert sha256(tmp_path / "g.gguf") == art.sha256
    assert made["config"] == art.made["config"] == synthetic.config_for("synthetic-gemma3")
    assert zoo.get("synthetic-gemma3").sha256 == art.sha256  # reused, not rewritten
    row = next(r for r in zoo.list_models() if r["name"] == "synthetic-gemma3")
    assert row["label"] == art.made["label"]


def test_gemma3_needs_its_tokenizer_source(tmp_path):
    from labkit.errors import LabkitError

    with pytest.raises(LabkitError, match="tokenizer source"):
        synthetic.write("synthetic-gemma3", tmp_path / "g.gguf")
    with pytest.raises(LabkitError, match="not a gemma3 GGUF"):
        synthetic.write("synthetic-gemma3", tmp_path / "g.gguf", tokenizer_gguf=zoo.get("synthetic-mtp").path)
