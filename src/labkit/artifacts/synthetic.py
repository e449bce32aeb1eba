"""Synthetic cost models: seeded random-weight GGUFs written with the ``gguf`` package.

They price things the embedded model cannot: how a verify of m rows costs when the
FFN (not a 262k-row output layer) dominates a step, what routing each extra row to
other experts adds in a MoE with the dense model's active parameters, and what one
MTP (nextn) draft step costs. Random weights make their acceptance meaningless:
they are valid for cost only.

Every model has ``tokenizer.ggml.model = "none"`` and ``<arch>.vocab_size``, so
llama.cpp loads it without a tokenizer and is fed token ids directly. Matmul
weights are Q4_0 (quantised with ``gguf.quants``), norms F32 and one, the router
F32 as llama.cpp's own quantiser leaves it. The same config gives the same bytes.

Why Q4_0: on x86 llama.cpp's CPU backend repacks Q4_0 (like the K-quants of real
models) into interleaved blocks for batched matmuls, so verify(m) scales as it does
for deployed models. Q8_0 has no x86 repack: its m >= 2 path measured 3-4x its m = 1
cost here, and a MoE (whose experts each see ~1 row) came out cheaper than the
dense model at m >= 2, hiding the expert term this pair exists to show.
"""

from __future__ import annotations

import time
from collections.abc import Iterator

import numpy as np

from labkit.artifacts import synthetic_gemma3
from labkit.errors import LabkitError

LABEL = "SYNTHETIC random weights: valid for cost only, never for acceptance"
GENERATOR_VERSION = 1  # bump when the tensors written for a config change

_COMMON = {
    "generator_version": GENERATOR_VERSION,
    "seed": 1234,
    "weight_type": "Q4_0",
    "init_std": 0.02,
    "n_ctx_train": 4096,
    "rope_freq_base": 10000.0,
    "rms_eps": 1e-5,
}

# Dense and MoE share everything but the FFN: the MoE's top-2 experts of n_ff/2 each
# hold exactly the dense FFN's weights, so one row reads the same FFN bytes in both.
_TRUNK = {"n_vocab": 4096, "n_embd": 1024, "n_layer": 4, "n_head": 16, "n_head_kv": 4}

CONFIGS: dict[str, dict] = {
    "synthetic-dense": {"arch": "llama", **_TRUNK, "n_ff": 2048, **_COMMON},
    "synthetic-moe": {
        "arch": "llama", **_TRUNK, "n_ff": 2048, "n_expert": 8, "n_expert_used": 2, "n_ff_exp": 1024, **_COMMON,
    },
    # the embedded model's width, depth and FFN (640, 18 layers, n_ff 2048, one KV head) with a
    # 4,096-token untied head: where a verify's time goes when the head is not most of the
    # weights (benchmarks/bench_verify_kernels.py --model synthetic-small-vocab --profile).
    # llama architecture, so attention is 640 wide where gemma-3's is 1,024
    "synthetic-small-vocab": {"arch": "llama", "n_vocab": 4096, "n_embd": 640, "n_layer": 18, "n_head": 4,
                              "n_head_kv": 1, "n_ff": 2048, **_COMMON},
    # glm4moe: block 0 dense, block 1 MoE with a shared expert, block 2 the nextn
    # (MTP) block that llama.cpp's MTP context runs. A few MB.
    "synthetic-mtp": {
        "arch": "glm4moe", "n_vocab": 2048, "n_embd": 256, "n_layer": 2, "n_nextn": 1, "n_head": 4,
        "n_head_kv": 2, "n_ff": 512, "n_expert": 4, "n_expert_used": 2, "n_ff_exp": 256,
        "n_expert_shared": 1, "n_layer_dense_lead": 1, **_COMMON,
    },
}

_FTYPE_ID = {"Q4_0": 2, "Q8_0": 7, "F16": 1}  # llama_ftype, written as general.file_type

# gemma3 test models (the embedded model's tokenizer, tiny random weights): see synthetic_gemma3
CONFIGS.update(synthetic_gemma3.CONFIGS)


def config_for(name: str) -> dict:
    """The generator settings of a synthetic zoo model (a fresh copy)."""
    if name not in CONFIGS:
        raise LabkitError(f"unknown synthetic model {name!r}", f"use one of {', '.join(CONFIGS)}")
    return dict(CONFIGS[name])


def _gguf():
    try:
        import gguf
    except ImportError as e:  # pragma: no cover - a core dependency
        raise LabkitError("the gguf package is not installed", "pip install gguf==0.19.0 (make setup does this)") from e
    return gguf


# -- tensors ------------------------------------------------------------------------------
# Shapes are numpy shapes, the reverse of GGUF ne: ne = [n_in, n_out] is (n_out, n_in),
# experts ne = [n_embd, n_ff_exp, n_expert] are (n_expert, n_ff_exp, n_embd).


def _attn(c: dict, i: int) -> Iterator[tuple[str, tuple, str]]:
    hd = c["n_embd"] // c["n_head"]
    e, q, kv = c["n_embd"], c["n_head"] * hd, c["n_head_kv"] * hd
    yield f"blk.{i}.attn_norm.weight", (e,), "norm"
    yield f"blk.{i}.attn_q.weight", (q, e), "w"
    yield f"blk.{i}.attn_k.weight", (kv, e), "w"
    yield f"blk.{i}.attn_v.weight", (kv, e), "w"
    yield f"blk.{i}.attn_output.weight", (e, q), "w"


def _ffn(i: int, e: int, f: int, suffix: str = "") -> Iterator[tuple[str, tuple, str]]:
    yield f"blk.{i}.ffn_gate{suffix}.weight", (f, e), "w"
    yield f"blk.{i}.ffn_up{suffix}.weight", (f, e), "w"
    yield f"blk.{i}.ffn_down{suffix}.weight", (e, f), "w"


def _experts(c: dict, i: int) -> Iterator[tuple[str, tuple, str]]:
    e, f, n = c["n_embd"], c["n_ff_exp"], c["n_expert"]
    yield f"blk.{i}.ffn_gate_inp.weight", (n, e), "router"
    yield f"blk.{i}.ffn_gate_exps.weight", (n, f, e), "w"
    yield f"blk.{i}.ffn_up_exps.weight", (n, f, e), "w"
    yield f"blk.{i}.ffn_down_exps.weight", (n, e, f), "w"


def _layout(c: dict) -> Iterator[tuple[str, tuple, str]]:
    """(name, numpy shape, kind) of every tensor, in file order."""
    e, v = c["n_embd"], c["n_vocab"]
    yield "token_embd.weight", (v, e), "w"
    yield "output_norm.weight", (e,), "norm"
    yield "output.weight", (v, e), "w"
    if c["arch"] == "llama":
        for i in range(c["n_layer"]):
            yield from _attn(c, i)
            yield f"blk.{i}.ffn_norm.weight", (e,), "norm"
            yield from (_experts(c, i) if c.get("n_expert") else _ffn(i, e, c["n_ff"]))
        return
    # glm4moe: the nextn blocks follow the trunk as blocks n_layer .. n_layer + n_nextn - 1
    for i in range(c["n_layer"] + c["n_nextn"]):
        yield from _attn(c, i)
        yield f"blk.{i}.post_attention_norm.weight", (e,), "norm"
        if i < c["n_layer_dense_lead"]:
            yield from _ffn(i, e, c["n_ff"])
            continue
        yield from _experts(c, i)
        yield f"blk.{i}.exp_probs_b.bias", (c["n_expert"],), "zero"
        yield from _ffn(i, e, c["n_ff_exp"] * c["n_expert_shared"], "_shexp")
        if i >= c["n_layer"]:
            yield f"blk.{i}.nextn.eh_proj.weight", (e, 2 * e), "w"
            yield f"blk.{i}.nextn.enorm.weight", (e,), "norm"
            yield f"blk.{i}.nextn.hnorm.weight", (e,), "norm"
            yield f"blk.{i}.nextn.shared_head_norm.weight", (e,), "norm"


def _metadata(w, c: dict) -> None:
    gguf = _gguf()
    w.add_name(f"labkit synthetic {c['arch']} (random weights)")
    w.add_description(LABEL)
    w.add_file_type(_FTYPE_ID[c["weight_type"]])
    n_blocks = c["n_layer"] + c.get("n_nextn", 0)
    w.add_block_count(n_blocks)
    w.add_context_length(c["n_ctx_train"])
    w.add_embedding_length(c["n_embd"])
    w.add_feed_forward_length(c["n_ff_exp"] if c["arch"] == "llama" and c.get("n_expert") else c["n_ff"])
    w.add_head_count(c["n_head"])
    w.add_head_count_kv(c["n_head_kv"])
    w.add_rope_freq_base(c["rope_freq_base"])
    w.add_layer_norm_rms_eps(c["rms_eps"])
    w.add_vocab_size(c["n_vocab"])
    if c.get("n_expert"):
        w.add_expert_count(c["n_expert"])
        w.add_expert_used_count(c["n_expert_used"])
    if c["arch"] == "glm4moe":
        w.add_expert_feed_forward_length(c["n_ff_exp"])
        w.add_expert_shared_count(c["n_expert_shared"])
        w.add_leading_dense_block_count(c["n_layer_dense_lead"])
        w.add_expert_weights_norm(True)
        w.add_expert_weights_scale(1.0)
        w.add_expert_gating_func(gguf.ExpertGatingFuncType.SIGMOID)
        w.add_nextn_predict_layers(c["n_nextn"])
    w.add_tokenizer_model("none")  # no tokenizer: token ids only


def _bytes(n_values: int, row: int, qtype: str) -> int:
    gguf = _gguf()
    block, size = gguf.GGML_QUANT_SIZES[gguf.GGMLQuantizationType[qtype]]
    assert row % block == 0
    return n_values // block * size


def _block(tensor_name: str) -> int:
    """The block index of a tensor name, -1 for the global tensors."""
    return int(tensor_name.split(".")[1]) if tensor_name.startswith("blk.") else -1


def accounting(c: dict) -> dict:
    """Parameter and byte counts that relate step cost to model shape.

    ``active_params``: the weights one row of a trunk step multiplies by (experts
    counted ``n_expert_used`` of ``n_expert``; nextn blocks excluded, they run only in
    the MTP context). ``active_ffn_params``: the FFN part of that, the quantity the
    dense and MoE models match exactly; the MoE adds only its router.
    """
    e, qt = c["n_embd"], c["weight_type"]
    total = active = nextn = nextn_bytes = 0
    for name, shape, kind in _layout(c):
        n = int(np.prod(shape))
        total += n
        if _block(name) >= c["n_layer"]:
            nextn += n
            nextn_bytes += _bytes(n, shape[-1], qt) if kind == "w" else 4 * n
            continue
        active += n // c["n_expert"] * c["n_expert_used"] if "_exps" in name else n
    out = {"total_params": total, "active_params": active, "embedding_params": c["n_vocab"] * e}
    if not c.get("n_expert"):
        ffn = c["n_layer"] * 3 * e * c["n_ff"]
        out.update(router_params=0, active_ffn_params=ffn, extra_row_expert_bytes_max=0, all_expert_bytes=0)
    else:
        lead = c.get("n_layer_dense_lead", 0)
        n_moe = c["n_layer"] - lead
        one = 3 * e * c["n_ff_exp"]  # one expert: gate + up + down
        one_bytes = _bytes(one, e, qt)
        out.update(
            moe_layers=n_moe,
            expert_params=one,
            expert_bytes=one_bytes,
            router_params=n_moe * e * c["n_expert"],
            active_ffn_params=lead * 3 * e * c["n_ff"]
            + n_moe * one * (c["n_expert_used"] + c.get("n_expert_shared", 0)),
            # A further verify row may route to experts no earlier row used: per MoE
            # layer it reads at most n_expert_used more experts.
            extra_row_expert_bytes_max=n_moe * c["n_expert_used"] * one_bytes,
            all_expert_bytes=n_moe * c["n_expert"] * one_bytes,
        )
    out["active_ffn_bytes"] = _bytes(out["active_ffn_params"], e, qt)
    if c.get("n_nextn"):
        out.update(nextn_params=nextn, nextn_bytes=nextn_bytes)
    return out


def write(name: str, path, *, tokenizer_gguf=None) -> dict:
    """Write the synthetic model ``name`` to ``path``; returns its provenance (``made``).

    ``tokenizer_gguf``: for the gemma3 models, the GGUF whose ``tokenizer.*`` metadata
    they copy (the zoo passes the embedded model).
    """
    gguf = _gguf()
    c = config_for(name)
    if c["arch"] == "gemma3":
        if tokenizer_gguf is None:
            raise LabkitError(f"{name} needs a tokenizer source", f"pass the {c['tokenizer']} GGUF (zoo.get does)")
        return synthetic_gemma3.write(c, path, tokenizer_gguf)
    t0 = time.perf_counter()
    rng = np.random.default_rng(c["seed"])
    qtype = gguf.GGMLQuantizationType[c["weight_type"]]
    w = gguf.GGUFWriter(str(path), c["arch"])
    n_bytes = 0
    try:
        _metadata(w, c)
        # One generator, tensors drawn in file order: the same config gives the same bytes.
        for tname, shape, kind in _layout(c):
            if kind in ("norm", "zero"):
                x = (np.ones if kind == "norm" else np.zeros)(shape, np.float32)
                w.add_tensor(tname, x)
            else:
                x = rng.standard_normal(shape, dtype=np.float32)
                x *= np.float32(c["init_std"])
                if kind == "w":
                    x = gguf.quants.quantize(x, qtype)
                    w.add_tensor(tname, x, raw_dtype=qtype)
                else:  # the router stays F32
                    w.add_tensor(tname, x)
            n_bytes += x.nbytes
        w.write_header_to_file()
        w.write_kv_data_to_file()
        w.write_tensors_to_file()
    finally:
        w.close()
    acc = accounting(c)
    return {
        "synthetic": True,
        "label": LABEL,
        "config": c,
        "architecture": c["arch"],
        "n_embd": c["n_embd"],
        "n_layer": c["n_layer"],
        "n_ff": c["n_ff"],
        "n_vocab": c["n_vocab"],
        "experts": (
            {"count": c["n_expert"], "used": c["n_expert_used"], "n_ff_expert": c["n_ff_exp"],
             "shared": c.get("n_expert_shared", 0)}
            if c.get("n_expert") else None
        ),
        "nextn_layers": c.get("n_nextn", 0),
        "tensor_bytes": n_bytes,
        **acc,
        "tool": f"gguf {_gguf_version()} GGUFWriter + gguf.quants ({c['weight_type']}), numpy {np.__version__}",
        "seconds": round(time.perf_counter() - t0, 2),
    }


def _gguf_version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("gguf")
    except PackageNotFoundError:  # pragma: no cover
        return "unknown"
