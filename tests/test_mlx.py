"""The MLX engine: conversion, tokens, rollback, lossless loops, acceptance equal to mlx-lm's
own speculative loop, and agreement with llama.cpp.

Most tests run on SYNTHETIC gemma3 models (``synthetic-gemma3``: the embedded model's
architecture and tokenizer, tiny random weights; ``synthetic-gemma3-q4_0`` the same draws
in Q4_0 as the draft), converted by the same ``mlx_convert.convert`` as the embedded
model: a 75 MB float32 directory instead of ~1.07 GB, a step a fraction of the real one.
One test keeps the real thing: the converted embedded model's greedy tokens agree with
llama.cpp's (that conversion is cached per machine).

Linux mlx-cpu: these check correctness only; no timing here is a speed claim.
"""

from __future__ import annotations

import importlib.util
import json
import os
import sys

import numpy as np
import pytest

from labkit.artifacts import zoo

if importlib.util.find_spec("mlx") is None or importlib.util.find_spec("mlx_lm") is None:
    pytest.skip("the mlx extra is not installed (pip install 'labkit[mlx]')", allow_module_level=True)

from labkit import engines  # noqa: E402
from labkit.analysis.lossless import MAX_NEAR_TIE, divergence_report  # noqa: E402
from labkit.artifacts import gguf_meta  # noqa: E402
from labkit.artifacts.mlx_convert import (  # noqa: E402
    dir_hashes,
    hf_name,
    mlx_root,
    resolve_mlx_model,  # noqa: E402
)
from labkit.config import runtime  # noqa: E402
from labkit.config.recipe import load as load_recipe  # noqa: E402
from labkit.decoding.drafters.model import ModelDrafter  # noqa: E402
from labkit.decoding.drafters.ngram import NgramDrafter  # noqa: E402
from labkit.decoding.loop import run, tokens_of  # noqa: E402
from labkit.engines.llamacpp import LlamaCppEngine  # noqa: E402
from labkit.engines.mlx import MlxEngine, full_cache  # noqa: E402
from labkit.errors import LabkitError  # noqa: E402
from labkit.measure.crossengine import cross_engine_agreement  # noqa: E402
from labkit.suites.workloads import WORKLOADS, load_workload  # noqa: E402

N_CTX = 2048
MAX = 24
N_CROSS = 32  # greedy tokens compared across engines
TARGET = "synthetic-gemma3"  # SYNTHETIC: the embedded model's tokenizer, random weights
DRAFT = "synthetic-gemma3-q4_0"  # the same draws requantised: a draft that is sometimes wrong
REAL_PROMPT = ("code", 0)  # the one prompt the converted embedded model is checked on


@pytest.fixture(scope="module")
def mlx_art():
    return resolve_mlx_model(TARGET)


@pytest.fixture(scope="module")
def mlx_engine(mlx_art):
    e = MlxEngine(mlx_art.path, n_ctx=N_CTX, n_threads=2, artifact=mlx_art.describe())
    yield e
    e.close()


@pytest.fixture(scope="module")
def mlx_draft():
    art = resolve_mlx_model(DRAFT)
    e = MlxEngine(art.path, n_ctx=N_CTX, n_threads=2, artifact=art.describe())
    yield e
    e.close()


@pytest.fixture(scope="module")
def syn_llama():
    """llama.cpp on the same synthetic GGUF the MLX target was converted from."""
    art = zoo.get(TARGET)
    e = LlamaCppEngine(art.path, n_ctx=N_CTX, n_threads=2, artifact=art.describe())
    yield e
    e.close()


@pytest.fixture(scope="module")
def real_mlx_art():
    """The embedded model converted to float32 MLX (~1.07 GB; built once per machine)."""
    return resolve_mlx_model(zoo.EMBEDDED)


def assert_lossless(engine, ids, plain, spec):
    rep = divergence_report(engine, ids, plain, spec)
    assert rep["lossless"], rep
    if not rep["identical"]:
        assert rep["divergence"]["spec_gap"] >= 0


# -- conversion and cache ---------------------------------------------------------------


def test_converted_directory_is_cached_with_a_stable_sidecar(mlx_art):
    again = resolve_mlx_model(TARGET)
    assert again.path == mlx_art.path and again.sha256 == mlx_art.sha256
    side = json.loads((mlx_root() / f"{mlx_art.name}.json").read_text())
    assert side["sha256"] == mlx_art.sha256
    assert side["made"]["source_sha256"] == zoo.get(TARGET).sha256
    files, sha = dir_hashes(mlx_art.path)
    assert sha == mlx_art.sha256 and files == side["files"]
    assert set(files) == {"config.json", "model.safetensors", "vocab.gguf"}
    # a touched (not changed) file is re-hashed, found identical, and not rebuilt
    cfg = mlx_art.path / "config.json"
    st = cfg.stat()
    os.utime(cfg, ns=(st.st_atime_ns, st.st_mtime_ns + 1_000_000))
    touched = resolve_mlx_model(TARGET)
    assert touched.sha256 == mlx_art.sha256
    assert (mlx_art.path / "model.safetensors").stat().st_mtime_ns == side["stat"]["model.safetensors"]["mtime_ns"]
    # an existing directory resolves to the same directory hash; a wrong hash is refused
    assert resolve_mlx_model(str(mlx_art.path)).sha256 == mlx_art.sha256
    with pytest.raises(LabkitError, match="checksum mismatch"):
        resolve_mlx_model(TARGET, expected_sha256="0" * 64)


def test_refuses_what_it_cannot_convert(tmp_path):
    with pytest.raises(LabkitError, match="synthetic"):
        resolve_mlx_model("synthetic-dense")
    with pytest.raises(LabkitError, match="not an MLX model directory"):
        resolve_mlx_model(str(tmp_path))
    assert hf_name("blk.7.post_ffw_norm.weight") == "model.layers.7.post_feedforward_layernorm.weight"
    with pytest.raises(LabkitError, match="gemma3_text"):
        hf_name("blk.0.ffn_gate_exps.weight")


def test_norm_weights_undo_llamacpps_plus_one(mlx_art):
    """gemma's RMSNorm is x * (1 + w): llama.cpp stores w + 1, mlx-lm adds the 1 itself.
    The synthetic model's norms are random (not all one), so every norm is checked."""
    import mlx.core as mx

    src = {t.name: np.array(t.data) for t in gguf_meta.read(zoo.get(TARGET).path).tensors}
    w = mx.load(str(mlx_art.path / "model.safetensors"))
    norms = [n for n in src if n.endswith("norm.weight")]
    assert len(norms) == 1 + 6 * 6
    for n in norms:
        assert np.allclose(np.array(w[hf_name(n)]) + 1, src[n], atol=1e-6), n
        assert np.abs(src[n] - 1).max() > 0.1, n  # a real check: not a vector of ones
    assert np.array_equal(np.array(w["model.layers.0.mlp.gate_proj.weight"]), src["blk.0.ffn_gate.weight"])
    assert w["model.embed_tokens.weight"].dtype == mx.float32


# -- the engine ------------------------------------------------------------------------


def test_tokens_match_llamacpp_on_every_workload_prompt(engine, mlx_engine):
    for name in WORKLOADS:
        for p in load_workload(name):
            ids = engine.tokenize(p.text)
            assert mlx_engine.tokenize(p.text) == ids, (name, p.id)
            assert mlx_engine.detokenize(ids[1:]) == engine.detokenize(ids[1:])
    assert mlx_engine.n_vocab == engine.n_vocab
    assert mlx_engine.vocab_fingerprint() == engine.vocab_fingerprint()
    assert mlx_engine.is_eog(1) and not mlx_engine.is_eog(2)
    # the synthetic model carries the embedded model's vocabulary, not a look-alike
    assert mlx_engine.token_text(ids[1]) == engine.token_text(ids[1])


def test_verify_rows_match_single_rows_and_rollback_is_exact(mlx_engine):
    e = mlx_engine
    ids = e.tokenize("The quick brown fox jumps over the lazy dog. It was the best of times.")
    e.rollback(0)
    e.decode(ids[:-4], all_logits=False)
    depth = e.n_past
    single = []
    for t in ids[-4:]:
        e.decode([t])
        single.append(np.array(e.logits(-1)))
    e.rollback(depth)
    e.decode(ids[-4:], all_logits=True)
    for j in range(4):
        assert e.argmax(j) == int(np.argmax(single[j]))
        assert np.abs(np.asarray(e.logits(j)) - single[j]).max() < 1e-2  # float32 throughout
    assert e.logits(0).dtype == np.float32 and e.logits(0).shape == (e.n_vocab,)
    e.rollback(depth)
    e.decode(ids[-4:-3])
    again = np.array(e.logits(-1))
    e.rollback(depth)
    e.decode(ids[-4:-3])
    assert np.array_equal(again, np.asarray(e.logits(-1)))
    with pytest.raises(IndexError):
        e.logits(1)
    e.rollback(0)


WINDOW = 16  # synthetic-gemma3's sliding window (the embedded model's is 512)
DEPTH = 40  # well past it


def test_rollback_past_the_sliding_window_matches_llamacpp(syn_llama, mlx_engine):
    """Beyond the window gemma3's own RotatingKVCache could not trim; the full cache can,
    and the window is still applied (the prefill row agrees with llama.cpp's)."""
    engine = syn_llama
    assert mlx_engine.model.args.sliding_window == WINDOW
    text = " ".join(p.text for p in load_workload("prose_en"))
    ids = engine.tokenize(text)
    while len(ids) < DEPTH:
        ids += ids[1:]
    ids = ids[:DEPTH]
    e = mlx_engine
    e.rollback(0)
    e.decode(ids, all_logits=False)
    row = np.array(e.logits(-1))
    engine.rollback(0)
    engine.decode(ids, all_logits=False)
    ref = np.array(engine.logits(-1))
    engine.rollback(0)
    assert int(np.argmax(row)) == int(np.argmax(ref))
    top = np.argsort(ref)[-5:]
    assert np.abs(row[top] - ref[top]).max() < MAX_NEAR_TIE
    e.decode([1000, 2000, 3000], all_logits=True)
    e.rollback(DEPTH)
    assert e.n_past == DEPTH and all(c.offset == DEPTH for c in e.cache)
    e.rollback(DEPTH - 1)
    e.decode(ids[-1:])
    assert np.abs(np.asarray(e.logits(-1)) - row).max() < 1e-2
    e.rollback(0)


def test_describe(mlx_engine):
    d = mlx_engine.describe()
    assert d["engine"] == "mlx" and d["build"]["mlx"] and d["build"]["mlx_lm"]
    assert d["dtype"] == "float32" and d["quantization"] is None
    assert d["device"].startswith("Device(")
    assert d["build"]["blas"]["blas"]
    assert d["model"]["sha256"] and d["n_vocab"] == 262144
    assert d["model"]["kind"] == "converted" and d["model"]["made"]["source"] == TARGET
    if sys.platform == "linux":
        assert "correctness" in d["label"]


@pytest.mark.slow  # converts the embedded model to ~1.07 GB of float32 once per machine
def test_recipe_opens_an_mlx_engine(real_mlx_art):
    r = load_recipe("mlx")
    assert r.engine == "mlx" and r.runs == 3
    assert engines.get("mlx") is MlxEngine
    art = runtime.resolve_model(r)
    assert art.sha256 == real_mlx_art.sha256 and art.made["source"] == zoo.EMBEDDED


# -- the speculative loop on MLX ---------------------------------------------------------


@pytest.mark.parametrize("workload", WORKLOADS)
@pytest.mark.slow
def test_ngram_is_lossless_on_mlx(mlx_engine, workload):
    ids = mlx_engine.tokenize(load_workload(workload)[0].text)
    plain = run(mlx_engine, ids, max_tokens=MAX)
    spec = run(mlx_engine, ids, drafter=NgramDrafter(), k=4, max_tokens=MAX)
    assert_lossless(mlx_engine, ids, plain, spec)


@pytest.mark.parametrize("workload", ["edit", "prose_zh"])
@pytest.mark.slow
def test_draft_model_is_lossless_on_mlx(mlx_engine, mlx_draft, workload):
    ids = mlx_engine.tokenize(load_workload(workload)[1].text)
    plain = run(mlx_engine, ids, max_tokens=MAX)
    spec = run(mlx_engine, ids, drafter=ModelDrafter(mlx_draft, target=mlx_engine), k=3, max_tokens=MAX)
    assert any(r.drafted for r in spec[1:])
    assert_lossless(mlx_engine, ids, plain, spec)


def mlx_lm_steps(target, draft, context: list[int], *, k: int, n: int) -> tuple[list[int], list[int]]:
    """mlx-lm's own speculative loop (greedy), as (tokens, accepted drafts per step).

    Its stream marks each accepted draft ``from_draft``; every step ends with one target
    token, so a step is a run of True followed by one False.
    """
    import mlx.core as mx
    from mlx_lm.generate import speculative_generate_step

    cache = full_cache(target.model) + full_cache(draft.model)  # trimmable past 512 positions
    toks, steps, acc = [], [], 0
    for tok, _, from_draft in speculative_generate_step(
        mx.array(context), target.model, draft.model, num_draft_tokens=k, max_tokens=n, prompt_cache=cache
    ):
        toks.append(int(tok))
        if from_draft:
            acc += 1
        else:
            steps.append(acc)
            acc = 0
    if acc:
        steps.append(acc)  # a last step cut by max_tokens before its target token
    return toks, steps


@pytest.mark.parametrize("workload", ["edit", "code"])
@pytest.mark.slow
def test_acceptance_equals_mlx_lms_speculative_loop(mlx_engine, mlx_draft, workload):
    k = 3
    ids = mlx_engine.tokenize(load_workload(workload)[0].text)
    recs = run(mlx_engine, ids, drafter=ModelDrafter(mlx_draft, target=mlx_engine), k=k, max_tokens=MAX,
               stop_at_eog=False)
    # labkit's first token comes from the prefill; mlx-lm drafts from the prompt's end.
    # Start mlx-lm after that token so both loops see the same history at every step.
    first = recs[0].tokens[0]
    toks, steps = mlx_lm_steps(mlx_engine, mlx_draft, ids + [first], k=k, n=MAX - 1)
    assert toks == tokens_of(recs[1:])
    assert steps == [r.accepted for r in recs[1:]]
    assert 0 < sum(steps) < k * len(steps)  # some drafts accepted, some rejected


def assert_agree(ref, other, ids):
    """Same GGUF weights on two engines: same greedy tokens, or a first divergence where
    both engines' own logit gaps are within the near-tie cap (not a conversion error)."""
    rep = cross_engine_agreement(ref, other, ids, n=N_CROSS)
    # a wrong conversion (e.g. the norm +1 applied twice) moves top logits by many units
    assert rep["max_top_diff"] < MAX_NEAR_TIE, rep
    if not rep["identical"]:
        d = rep["divergence"]
        assert 0 <= d["ref_gap"] <= MAX_NEAR_TIE and 0 <= d["other_gap"] <= MAX_NEAR_TIE, rep
    return rep


@pytest.mark.parametrize("workload", WORKLOADS)
@pytest.mark.slow
def test_greedy_tokens_agree_with_llamacpp(syn_llama, mlx_engine, workload):
    ids = syn_llama.tokenize(load_workload(workload)[0].text)
    assert_agree(syn_llama, mlx_engine, ids)


@pytest.mark.slow  # converts the embedded model to ~1.07 GB of float32 once per machine
def test_converted_embedded_model_agrees_with_llamacpp(engine, real_mlx_art):
    """The real weights once: the converted embedded model's greedy tokens on one prompt."""
    workload, i = REAL_PROMPT
    e = MlxEngine(real_mlx_art.path, n_ctx=N_CTX, n_threads=2, artifact=real_mlx_art.describe())
    try:
        assert e.describe()["model_n_params"] > 200_000_000  # the real model, not a synthetic one
        assert_agree(engine, e, engine.tokenize(load_workload(workload)[i].text))
    finally:
        e.close()
