"""The llama.cpp engine on the real embedded model."""

from __future__ import annotations

import numpy as np
import pytest

from labkit.analysis.lossless import top2_gap
from labkit.engines import EngineError
from labkit.engines.llamacpp import LlamaCppEngine
from labkit.errors import LabkitError

TEXT = "The quick brown fox jumps over the lazy dog. It was the best of times."


def test_tokenize_roundtrip(engine):
    ids = engine.tokenize(TEXT)
    assert ids[0] == 2  # gemma's <bos>
    assert engine.detokenize(ids[1:]) == TEXT
    assert engine.n_vocab == 262144


def test_verify_rows_match_single_rows_and_rollback_is_exact(engine):
    ids = engine.tokenize(TEXT)
    engine.rollback(0)
    engine.decode(ids[:-4], all_logits=False)
    depth = engine.n_past
    single = []
    for t in ids[-4:]:
        engine.decode([t])
        single.append(np.array(engine.logits(-1)))
    engine.rollback(depth)
    assert engine.n_past == depth
    engine.decode(ids[-4:], all_logits=True)
    for j in range(4):
        # Batched and single-row kernels quantise activations differently: the rows are
        # close (same argmax here, top logits within the lossless check's near-tie cap)
        # but not bit-identical.
        b = np.asarray(engine.logits(j))
        assert engine.argmax(j) == int(np.argmax(single[j]))
        top = np.argsort(single[j])[-5:]
        assert np.abs(b[top] - single[j][top]).max() < 1.5
    # a rolled-back and re-decoded row reproduces its logits exactly
    engine.rollback(depth)
    engine.decode(ids[-4:-3])
    again = np.array(engine.logits(-1))
    engine.rollback(depth)
    engine.decode(ids[-4:-3])
    assert np.array_equal(again, np.asarray(engine.logits(-1)))
    engine.rollback(0)


def test_logits_row_bounds(engine):
    engine.rollback(0)
    engine.decode(engine.tokenize("Hello"), all_logits=False)
    with pytest.raises(IndexError):
        engine.logits(1)
    engine.rollback(0)


def test_context_overflow_is_refused_before_touching_the_cache(engine):
    engine.rollback(0)
    engine.decode(engine.tokenize("Hello there"), all_logits=False)
    kept = engine.n_past
    with pytest.raises(EngineError, match="raise n_ctx"):
        engine.decode([100] * (engine.n_ctx + 1))
    assert engine.n_past == kept
    engine.decode([100])  # still usable
    engine.rollback(0)


def test_describe_is_provenance(engine, embedded):
    d = engine.describe()
    assert d["engine"] == "llama.cpp"
    assert d["model"]["sha256"] == embedded.sha256
    # what the build reports: every instruction set its CMake flags switched on shows up in
    # llama.cpp's system info (on any CPU: ARM/macOS builds carry other flags)
    build = d["build"]
    for isa in ("AVX2", "FMA", "F16C", "BMI2", "NEON", "AVX512"):
        if f"-DGGML_{isa}=ON" in (build.get("cmake_args") or ""):
            assert f"{isa} = 1" in build["system_info"], isa
    assert build["llama_cpp_python"] == "0.3.36"
    # layers as the model file declares them (its GGUF metadata), all accounted for
    # (gguf_meta, not GGUFReader: that parses the 262k-token vocabulary for ~10 s on 2 idle cores)
    from labkit.artifacts import gguf_meta

    reader = gguf_meta.read(embedded.path)
    arch = reader.get("general.architecture")
    n_layer = int(reader.get(f"{arch}.block_count"))
    res = d["residency"]
    assert d["n_layer"] == n_layer
    assert res["layers_on_host"] + res.get("layers_on_accelerator", 0) == n_layer
    assert d["threads"] == 2 and d["n_ctx"] >= 2048


def test_missing_and_corrupt_model_files(tmp_path):
    with pytest.raises(LabkitError, match="not found"):
        LlamaCppEngine(tmp_path / "nope.gguf")
    bad = tmp_path / "truncated.gguf"
    bad.write_bytes(b"GGUF" + b"\0" * 64)
    with pytest.raises(EngineError, match="could not load"):
        LlamaCppEngine(bad)


def test_top2_gap():
    row = np.array([0.0, 3.0, 2.5, -1.0], dtype=np.float32)
    assert top2_gap(row) == (1, 2, pytest.approx(0.5))


def test_prefill_keeps_a_shared_prefix_reproducibly(engine):
    a = engine.tokenize("Shared preamble: the quick brown fox jumps over the lazy dog. Task one.")
    b = engine.tokenize("Shared preamble: the quick brown fox jumps over the lazy dog. Task two, longer.")
    keep = next(i for i, (x, y) in enumerate(zip(a, b)) if x != y)
    assert engine.prefill(a, keep=keep) == len(a) - keep
    assert engine.kv_tokens == a
    engine.decode([5, 6, 7])  # generated tokens after the prompt
    assert engine.prefill(b, keep=keep) == len(b) - keep  # the prefix is kept, the rest decoded
    assert engine.kv_tokens == b and engine.n_past == len(b)
    kept = np.array(engine.logits(-1))
    engine.rollback(0)
    engine.prefill(b, keep=keep)  # prefix recomputed from scratch by the same batches
    assert np.array_equal(kept, np.asarray(engine.logits(-1)))
    engine.prefill(b)  # one batch: close, not necessarily bit-identical
    assert engine.argmax(-1) == int(np.argmax(kept))
    engine.rollback(0)
    assert engine.kv_tokens == []
