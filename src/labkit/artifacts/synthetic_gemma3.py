"""SYNTHETIC gemma3 test models: the embedded model's architecture and tokenizer, tiny random weights.

The MLX tests need a gemma3 GGUF that llama.cpp loads and ``mlx_convert.convert`` turns
into an mlx-lm directory by the same code path as the embedded model, but whose float32
conversion is a few MB to a few tens of MB instead of ~1 GB, and whose steps cost a
fraction of the real model's on a CPU. So:

- every ``tokenizer.*`` key is copied from the embedded GGUF (262,144 tokens): prompts
  tokenize to exactly the embedded model's ids on both engines;
- tensors have gemma3's names and layout (the embedded file's, checked by
  tests/test_synthetic.py): ``token_embd`` (tied output), ``output_norm``, and per block
  ``attn_{norm,q,k,v,output,q_norm,k_norm}``, ``post_attention_norm``, ``ffn_norm``,
  ``ffn_{gate,up,down}``, ``post_ffw_norm``;
- norm weights are written as llama.cpp's converter writes gemma's: the multiplier
  ``1 + w`` itself (``norm_shift``). They are random (not all one), so a converter that
  forgot to subtract the 1 again would change the logits, not only their scale;
- matmul weights have std 1/sqrt(fan_in) (activations keep their scale); the output
  norm's gain is ``output_gain`` times larger, which spreads the tied-output logits so
  greedy ties are rare and the engines' float32 differences never flip an argmax.

Random weights make every acceptance rate meaningless: these models prove that engines
agree and that loops are lossless, nothing about speed-up. Same config, same bytes.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from importlib.metadata import version

import numpy as np

from labkit.artifacts import gguf_meta
from labkit.errors import LabkitError

LABEL = ("SYNTHETIC random weights with the embedded model's tokenizer: for engine-agreement "
         "tests, never for acceptance or cost claims")
GENERATOR_VERSION = 1  # bump when the tensors written for a config change

# Six layers because gemma3 makes every sixth layer global (llama.cpp's default pattern;
# mlx-lm reads layer 5's cache for the global mask), so both kinds of attention and both
# rope bases run; a 16-position window so a short context already crosses it.
_BASE = {
    "arch": "gemma3", "generator_version": GENERATOR_VERSION, "seed": 2718, "tokenizer": "gemma-3-270m-q4_k_m",
    "n_vocab": 262144, "n_embd": 64, "n_layer": 6, "n_head": 2, "n_head_kv": 1, "head_dim": 32, "n_ff": 256,
    "sliding_window": 16, "n_ctx_train": 32768, "rope_freq_base": 1_000_000.0, "rms_eps": 1e-6,
    # Norm gains are 1 + N(0, norm_std), in the GGUF's (w + 1) form; q/k norms and the output
    # norm are scaled by qk_gain and output_gain. Measured (greedy, 32 tokens, each workload's
    # first prompt): embd_std 0.25 with plain q/k norms repeats one token forever, 0.1 never
    # repeats; 0.15 with sharper attention (qk_gain 2) repeats for a while and moves on (n-gram
    # drafts: 42 of 52 accepted), and llama.cpp and MLX agree on every token (top-5 logits
    # within 0.3). qk_gain 4 made attention nearly hard-max: the engines' float differences
    # then flipped attention and logits moved by up to 7. output_gain only scales the logits
    # (argmax unchanged): top-1 gaps of a few logits dwarf the engines' differences.
    "embd_std": 0.15, "norm_std": 0.2, "output_gain": 16.0, "qk_gain": 2.0, "weight_type": "F32",
}
CONFIGS = {
    "synthetic-gemma3": _BASE,
    # The same draws written as Q4_0 (norms stay F32): a draft that mostly agrees with the
    # target and sometimes does not, as gemma-3-270m-q4_0 does for the embedded model.
    "synthetic-gemma3-q4_0": {**_BASE, "weight_type": "Q4_0"},
}
_FTYPE_ID = {"F32": 0, "Q4_0": 2, "Q8_0": 7}  # llama_ftype, written as general.file_type


def layout(c: dict) -> Iterator[tuple[str, tuple, str]]:
    """(name, numpy shape, kind) of every tensor, in file order (numpy shape = reversed GGUF ne)."""
    e, hd, f = c["n_embd"], c["head_dim"], c["n_ff"]
    q, kv = c["n_head"] * hd, c["n_head_kv"] * hd
    yield "token_embd.weight", (c["n_vocab"], e), "embd"
    yield "output_norm.weight", (e,), "output_norm"
    for i in range(c["n_layer"]):
        b = f"blk.{i}"
        yield f"{b}.attn_norm.weight", (e,), "norm"
        yield f"{b}.attn_q.weight", (q, e), "w"
        yield f"{b}.attn_k.weight", (kv, e), "w"
        yield f"{b}.attn_v.weight", (kv, e), "w"
        yield f"{b}.attn_q_norm.weight", (hd,), "qk_norm"
        yield f"{b}.attn_k_norm.weight", (hd,), "qk_norm"
        yield f"{b}.attn_output.weight", (e, q), "w"
        yield f"{b}.post_attention_norm.weight", (e,), "norm"
        yield f"{b}.ffn_norm.weight", (e,), "norm"
        yield f"{b}.ffn_gate.weight", (f, e), "w"
        yield f"{b}.ffn_up.weight", (f, e), "w"
        yield f"{b}.ffn_down.weight", (e, f), "w"
        yield f"{b}.post_ffw_norm.weight", (e,), "norm"


def _draw(rng, shape: tuple, kind: str, c: dict) -> np.ndarray:
    """One tensor's float32 values; the generator advances the same way for every weight_type."""
    if kind.endswith("norm"):
        x = np.float32(1.0) + np.float32(c["norm_std"]) * rng.standard_normal(shape, dtype=np.float32)
        return x * np.float32(c[kind.replace("norm", "gain")]) if kind != "norm" else x
    std = c["embd_std"] if kind == "embd" else 1.0 / np.sqrt(shape[-1])
    return rng.standard_normal(shape, dtype=np.float32) * np.float32(std)


def _copy_tokenizer(w, tokenizer_gguf) -> int:
    """Copy every ``tokenizer.*`` key of ``tokenizer_gguf``; returns the number of tokens."""
    src = gguf_meta.read(tokenizer_gguf)
    if src.get("general.architecture") != "gemma3":
        raise LabkitError(f"{tokenizer_gguf} is not a gemma3 GGUF", "use the embedded model as the tokenizer source")
    for kv in src.kv.values():
        if kv.name.startswith("tokenizer."):
            w.add_key_value(kv.name, kv.value, kv.type, sub_type=kv.sub_type)
    return len(src.get("tokenizer.ggml.tokens", []))


def write(c: dict, path, tokenizer_gguf) -> dict:
    """Write the gemma3 test model of config ``c`` to ``path``; returns its provenance (``made``)."""
    import gguf

    t0 = time.perf_counter()
    rng = np.random.default_rng(c["seed"])
    qtype = gguf.GGMLQuantizationType[c["weight_type"]]
    w = gguf.GGUFWriter(str(path), "gemma3")
    n_bytes = n_params = 0
    try:
        w.add_name("labkit synthetic gemma3 (random weights)")
        w.add_description(LABEL)
        w.add_file_type(_FTYPE_ID[c["weight_type"]])
        w.add_context_length(c["n_ctx_train"])
        w.add_embedding_length(c["n_embd"])
        w.add_block_count(c["n_layer"])
        w.add_feed_forward_length(c["n_ff"])
        w.add_head_count(c["n_head"])
        w.add_head_count_kv(c["n_head_kv"])
        w.add_key_length(c["head_dim"])
        w.add_value_length(c["head_dim"])
        w.add_layer_norm_rms_eps(c["rms_eps"])
        w.add_rope_freq_base(c["rope_freq_base"])
        w.add_sliding_window(c["sliding_window"])
        n_tokens = _copy_tokenizer(w, tokenizer_gguf)
        if n_tokens != c["n_vocab"]:
            raise LabkitError(f"{tokenizer_gguf} has {n_tokens} tokens, the config expects {c['n_vocab']}",
                              "use the embedded model as the tokenizer source")
        for name, shape, kind in layout(c):
            x = _draw(rng, shape, kind, c)
            n_params += x.size
            if kind in ("w", "embd") and c["weight_type"] != "F32":
                x = gguf.quants.quantize(x, qtype)
                w.add_tensor(name, x, raw_dtype=qtype)
            else:  # norms stay F32, as llama.cpp's quantiser leaves them
                w.add_tensor(name, x)
            n_bytes += x.nbytes
        w.write_header_to_file()
        w.write_kv_data_to_file()
        w.write_tensors_to_file()
    finally:
        w.close()
    return {
        "synthetic": True,
        "label": LABEL,
        "config": dict(c),
        "architecture": "gemma3",
        "n_embd": c["n_embd"],
        "n_layer": c["n_layer"],
        "n_ff": c["n_ff"],
        "n_vocab": c["n_vocab"],
        "experts": None,
        "nextn_layers": 0,
        "tensor_bytes": n_bytes,
        "total_params": n_params,
        "embedding_params": c["n_vocab"] * c["n_embd"],
        "tokenizer_source": str(tokenizer_gguf),
        "tool": f"gguf {version('gguf')} GGUFWriter ({c['weight_type']}), numpy {np.__version__}",
        "seconds": round(time.perf_counter() - t0, 2),
    }
