"""GGUF -> mlx-lm model directory, offline, and the cache of converted directories.

``mx.load`` cannot read K-quant GGUFs, so every tensor is dequantized with the
``gguf`` package (numpy) and written as float32 safetensors:

- float32 keeps the dequantized values exactly (a Q4_K/Q6_K/Q5_0 weight is an fp16
  scale times a small integer, which fp16/bf16 would round again), so MLX computes
  with the same weights llama.cpp does; on MLX's CPU backend float32 is also the
  fastest dtype (measured: a 262k-row output matmul costs ~73 ms in float32, ~197 ms
  in bfloat16, ~258 ms in float16 with OpenBLAS). It costs disk: ~1.07 GB for 270M.
- Gemma RMSNorm computes ``x * (1 + w)``. llama.cpp's converter stores ``w + 1`` in
  the GGUF (``norm_shift``), and mlx-lm's gemma3_text adds the 1 itself, so the
  converter subtracts 1 from every ``*norm.weight`` (checked against llama.cpp logits
  in tests/test_mlx.py).
- The tokenizer is the GGUF's own: its metadata (no tensors) is written to
  ``vocab.gguf`` and loaded with llama.cpp's ``vocab_only``, so token ids match
  llama.cpp exactly, Chinese included; no HF tokenizer is reconstructed.

A converted directory lives in ``cache_dir()/mlx/<name>/`` with a sidecar
``<name>.json`` beside it (source sha256, converter version, per-file sha256, a
directory sha256); it is rebuilt when the source or converter changes, or when its
files no longer hash to what the sidecar says.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np

from labkit.artifacts import gguf_meta, zoo
from labkit.engines.mlx import VOCAB_FILE
from labkit.errors import LabkitError
from labkit.paths import cache_dir, exclusive

CONVERTER_VERSION = 1
DTYPE = "float32"
WEIGHTS_FILE = "model.safetensors"
SUPPORTED_ARCHS = ("gemma3",)

# GGUF tensor name (after "blk.N.") -> mlx-lm / HF gemma3_text name (after "model.layers.N.")
_BLOCK_NAMES = {
    "attn_q": "self_attn.q_proj",
    "attn_k": "self_attn.k_proj",
    "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj",
    "attn_q_norm": "self_attn.q_norm",
    "attn_k_norm": "self_attn.k_norm",
    "attn_norm": "input_layernorm",
    "post_attention_norm": "post_attention_layernorm",
    "ffn_norm": "pre_feedforward_layernorm",
    "post_ffw_norm": "post_feedforward_layernorm",
    "ffn_gate": "mlp.gate_proj",
    "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj",
}
_TOP_NAMES = {"token_embd": "model.embed_tokens", "output_norm": "model.norm", "output": "lm_head"}


def hf_name(gguf_name: str) -> str:
    """``blk.3.attn_q.weight`` -> ``model.layers.3.self_attn.q_proj.weight``."""
    stem, _, suffix = gguf_name.rpartition(".")
    parts = stem.split(".")
    if parts[0] == "blk" and len(parts) == 3 and parts[2] in _BLOCK_NAMES:
        return f"model.layers.{parts[1]}.{_BLOCK_NAMES[parts[2]]}.{suffix}"
    if stem in _TOP_NAMES:
        return f"{_TOP_NAMES[stem]}.{suffix}"
    raise LabkitError(f"GGUF tensor {gguf_name!r} has no gemma3_text counterpart", "only gemma3 GGUFs convert")


def _field(reader, key: str, default=None):
    return reader.get(key, default)


def config_from_gguf(reader) -> dict:
    """An mlx-lm ``config.json`` (model_type gemma3_text) from the GGUF's metadata.

    Keys the GGUF lacks take llama.cpp's own defaults for gemma3 (src/models/gemma3.cpp):
    SWA every layer but each 6th, SWA rope base 10000, attention scale 1/sqrt(head_dim)
    (i.e. query_pre_attn_scalar = head_dim) for every size but 27B.
    """
    arch = _field(reader, "general.architecture")
    if arch not in SUPPORTED_ARCHS:
        raise LabkitError(f"cannot convert a {arch!r} GGUF to MLX", f"supported: {', '.join(SUPPORTED_ARCHS)}")
    a = arch
    n_embd = int(_field(reader, f"{a}.embedding_length"))
    n_head = int(_field(reader, f"{a}.attention.head_count"))
    head_dim = int(_field(reader, f"{a}.attention.key_length", n_embd // n_head))
    n_layer = int(_field(reader, f"{a}.block_count"))
    vocab = len(reader.get("tokenizer.ggml.tokens"))
    swa = _field(reader, f"{a}.attention.sliding_window")
    if _field(reader, f"{a}.final_logit_softcapping") or _field(reader, f"{a}.rope.scaling.type"):
        raise LabkitError("this gemma3 GGUF uses logit softcapping or rope scaling", "not supported by the converter")
    return {
        "architectures": ["Gemma3ForCausalLM"],
        "model_type": "gemma3_text",
        "hidden_size": n_embd,
        "num_hidden_layers": n_layer,
        "intermediate_size": int(_field(reader, f"{a}.feed_forward_length")),
        "num_attention_heads": n_head,
        "num_key_value_heads": int(_field(reader, f"{a}.attention.head_count_kv", n_head)),
        "head_dim": head_dim,
        "rms_norm_eps": float(_field(reader, f"{a}.attention.layer_norm_rms_epsilon")),
        "vocab_size": vocab,
        "rope_theta": float(_field(reader, f"{a}.rope.freq_base", 1_000_000.0)),
        "rope_local_base_freq": float(_field(reader, f"{a}.rope.freq_base_swa", 10_000.0)),
        "query_pre_attn_scalar": float(head_dim if n_layer != 62 else n_embd // n_head),
        "sliding_window": int(swa) if swa else 1 << 30,
        "sliding_window_pattern": 6 if swa else 1,
        "max_position_embeddings": int(_field(reader, f"{a}.context_length", 32768)),
        "rope_scaling": None,
        "tie_word_embeddings": "output.weight" not in {t.name for t in reader.tensors},
        "bos_token_id": _field(reader, "tokenizer.ggml.bos_token_id"),
        "eos_token_id": _field(reader, "tokenizer.ggml.eos_token_id"),
        "torch_dtype": DTYPE,
    }


def write_vocab(reader, path: Path) -> None:
    """The GGUF's metadata without tensors: enough for llama.cpp's ``vocab_only`` load."""
    import gguf

    w = gguf.GGUFWriter(path, _field(reader, "general.architecture"))
    for kv in reader.kv.values():
        if kv.name != gguf.Keys.General.ARCHITECTURE:  # the writer adds it itself
            w.add_key_value(kv.name, kv.value, kv.type, sub_type=kv.sub_type)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_ti_data_to_file()
    w.close()


def convert(gguf_path: str | os.PathLike, out_dir: str | os.PathLike) -> dict:
    """Write ``model.safetensors``, ``config.json`` and ``vocab.gguf`` for ``gguf_path`` into ``out_dir``."""
    import gguf

    from labkit.engines.mlx import import_mlx

    mx = import_mlx()
    t0 = time.perf_counter()
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    reader = gguf_meta.read(gguf_path)  # GGUFReader parses a 262k-token vocabulary ~50x slower
    config = config_from_gguf(reader)
    weights, types = {}, {}
    for t in reader.tensors:
        name = hf_name(t.name)
        w = np.asarray(gguf.quants.dequantize(t.data, t.tensor_type), dtype=np.float32)
        if t.name.endswith("norm.weight"):
            w = w - np.float32(1.0)  # undo llama.cpp's norm_shift: mlx-lm computes (1 + w)
        weights[name] = mx.array(np.ascontiguousarray(w))
        types[t.tensor_type.name] = types.get(t.tensor_type.name, 0) + 1
    mx.save_safetensors(str(out / WEIGHTS_FILE), weights, metadata={"format": "mlx"})
    (out / "config.json").write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")
    write_vocab(reader, out / VOCAB_FILE)
    return {
        "tool": "labkit.artifacts.mlx_convert (gguf.quants.dequantize -> mx.save_safetensors)",
        "converter_version": CONVERTER_VERSION,
        "gguf_version": _version("gguf"),
        "mlx_version": _version("mlx"),
        "dtype": DTYPE,
        "norm_shift": -1.0,
        "source_tensor_types": types,
        "n_tensors": len(weights),
        "tokenizer": f"{VOCAB_FILE}: the GGUF's metadata, read by llama.cpp (vocab_only)",
        "seconds": round(time.perf_counter() - t0, 2),
    }


def _version(dist: str) -> str | None:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version(dist)
    except PackageNotFoundError:
        return None


# -- the cache of converted directories ------------------------------------------------


@dataclass
class MlxArtifact:
    """A converted (or user-supplied) MLX model directory with its provenance."""

    name: str
    path: Path
    sha256: str  # of the directory: see dir_hashes
    files: dict[str, str]
    kind: str  # "converted" | "user"
    made: dict = field(default_factory=dict)
    sha256_verified: bool = False  # checked against a recipe's pinned model_sha256, not only computed

    def describe(self) -> dict:
        d = asdict(self)
        d["path"] = str(self.path)
        return d


def mlx_root() -> Path:
    d = cache_dir() / "mlx"
    d.mkdir(parents=True, exist_ok=True)
    return d


def dir_hashes(path: Path) -> tuple[dict[str, str], str]:
    """Per-file sha256 of a directory, and its sha256: of the sorted ``name  sha`` lines."""
    files = {p.relative_to(path).as_posix(): zoo.sha256_file(p) for p in sorted(path.rglob("*")) if p.is_file()}
    blob = "".join(f"{name}  {sha}\n" for name, sha in sorted(files.items()))
    return files, hashlib.sha256(blob.encode()).hexdigest()


def _stat_key(path: Path) -> dict:
    """Per file, ``zoo.stat_key`` (size, mtime, and the inode/ctime that os.utime cannot put back)."""
    return {p.relative_to(path).as_posix(): zoo.stat_key(p) for p in sorted(path.rglob("*")) if p.is_file()}


def _read_sidecar(side: Path) -> dict:
    try:
        return json.loads(side.read_text()) if side.is_file() else {}
    except (json.JSONDecodeError, OSError):
        return {}


def _converted(src: zoo.ModelArtifact, name: str, *, rebuild: bool) -> MlxArtifact:
    path = mlx_root() / name
    side = mlx_root() / f"{name}.json"
    meta = _read_sidecar(side)
    made = meta.get("made", {})
    fresh = (
        not rebuild and path.is_dir() and made.get("source_sha256") == src.sha256
        and made.get("converter_version") == CONVERTER_VERSION
    )
    if fresh and meta.get("stat") == _stat_key(path):
        return MlxArtifact(name, path, meta["sha256"], meta["files"], "converted", made)
    if fresh:  # files touched since the sidecar: trust them only if they still hash the same
        files, sha = dir_hashes(path)
        if sha == meta.get("sha256"):
            art = MlxArtifact(name, path, sha, files, "converted", made)
            _write_sidecar(side, art)
            return art
    tmp = path.with_name(path.name + ".partial")
    shutil.rmtree(tmp, ignore_errors=True)
    made = {**convert(src.path, tmp), "source": src.name, "source_path": str(src.path),
            "source_sha256": src.sha256}
    shutil.rmtree(path, ignore_errors=True)
    os.replace(tmp, path)
    files, sha = dir_hashes(path)
    art = MlxArtifact(name, path, sha, files, "converted", made)
    _write_sidecar(side, art)
    return art


def _write_sidecar(side: Path, art: MlxArtifact) -> None:
    meta = {**art.describe(), "stat": _stat_key(art.path)}
    tmp = side.with_suffix(".tmp")
    tmp.write_text(json.dumps(meta, indent=2))
    os.replace(tmp, side)


def resolve_mlx_model(name_or_path: str, *, expected_sha256: str | None = None,
                      rebuild: bool = False) -> MlxArtifact:
    """A zoo name or .gguf path (converted on demand) or an existing MLX directory.

    ``expected_sha256`` is the directory sha256 (``dir_hashes``) and must match.
    """
    p = Path(name_or_path).expanduser()
    if name_or_path not in zoo.ZOO and p.is_dir():
        if not (p / "config.json").is_file():
            raise LabkitError(f"{p} is not an MLX model directory (no config.json)",
                              "point at a directory made by mlx_lm.convert or labkit, or use a zoo name")
        files, sha = dir_hashes(p)
        art = MlxArtifact(p.name, p.resolve(), sha, files, "user")
    else:
        src = zoo.get(name_or_path)
        if src.synthetic and src.made.get("architecture") not in SUPPORTED_ARCHS:
            raise LabkitError(f"{src.name} is a synthetic cost model",
                              "MLX runs gemma3 models only (real ones, or the synthetic-gemma3 test models)")
        name = src.name if src.kind != "user" else f"{src.name}-{src.sha256[:8]}"
        with exclusive(mlx_root() / f".{name}.lock"):  # one conversion at a time (see zoo.get)
            art = _converted(src, name, rebuild=rebuild)
    if expected_sha256 and art.sha256 != expected_sha256.lower():
        raise LabkitError(
            f"checksum mismatch for MLX model {art.name} ({art.path}): expected {expected_sha256}, "
            f"directory has {art.sha256}",
            "rebuild it (resolve_mlx_model(..., rebuild=True)) or update model_sha256 in the recipe",
        )
    art.sha256_verified = bool(expected_sha256)
    return art


# -- checking a conversion against llama.cpp -------------------------------------------




