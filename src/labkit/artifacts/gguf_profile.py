"""A model's cost profile from its GGUF header alone: what one step must read, layer by layer.

The planner (``analysis.plan``) prices a verify of m rows from bytes: which weights every
row reads (attention, dense FFN, shared experts, router, norms), which only some rows read
(routed experts, ``n_expert_used`` of ``n_expert`` per row), what only the MTP draft reads
(the nextn blocks), and the output matrix (the token embedding when the two are tied).
All of it is in the tensor table: name, GGUF ``ne`` and quant type give each tensor's bytes
without touching its data, so a 200 GB model's header profiles on a laptop and a
header-only GGUF (tensor infos, no data) profiles like the real file.

Tensors are classified by name (llama.cpp's names, ``gguf.constants.TENSOR_NAMES``). A name
the rules do not cover is kept out of every term and listed in ``unclassified`` with its
bytes, so a plan of an unknown architecture says what it left out instead of guessing.
"""

from __future__ import annotations

import os
import re
import struct
from dataclasses import asdict, dataclass, field

import numpy as np

from labkit.artifacts import gguf_meta
from labkit.errors import LabkitError

CATEGORIES = ("attention", "ffn_dense", "ffn_shared", "experts", "router", "norms")
DENSE_CATEGORIES = tuple(c for c in CATEGORIES if c != "experts")  # read by every row
_BLK = re.compile(r"^blk\.(\d+)\.(.+?)(?:\.weight|\.bias)?$")
_RULES = (  # (category, pattern on the part after "blk.N."), first match wins
    ("nextn", re.compile(r"^nextn\.")),
    ("experts", re.compile(r"^ffn_(gate_up|gate|up|down)_(ch)?exps$")),
    ("ffn_shared", re.compile(r"^ffn_(gate|up|down|gate_inp)_shexp$")),
    ("router", re.compile(r"^(ffn_gate_inp|exp_probs_b)$")),
    ("norms", re.compile(r"(norm|_scale|^ffn_norm_exps|attn_sinks|rope_freqs|layer_output_scale)")),
    ("attention", re.compile(r"^(attn_|indexer\.|ssm_|time_mix_|shortconv\.|inp_gate)")),
    ("ffn_dense", re.compile(r"^(ffn_(gate|up|down|gate_up|latent_up|latent_down)|ffn|channel_mix_.*)$")),
)
_TOP = {"token_embd": "embeddings", "per_layer_token_embd": "embeddings", "output": "output",
        "output_norm": "norms", "rope_freqs": "norms", "token_embd_norm": "norms", "rope_factors_long": "norms",
        "rope_factors_short": "norms", "per_layer_model_proj": "norms", "per_layer_proj_norm": "norms"}


@dataclass
class Layer:
    """One block's bytes (and elements, for compute) per category; ``experts`` is all routed experts."""

    index: int
    nextn: bool = False
    bytes: dict = field(default_factory=lambda: dict.fromkeys(CATEGORIES, 0))
    elements: dict = field(default_factory=lambda: dict.fromkeys(CATEGORIES, 0))


@dataclass
class ModelProfile:
    path: str
    architecture: str
    known_architecture: bool
    n_layer: int  # trunk blocks (nextn blocks excluded)
    n_nextn: int
    n_expert: int
    n_expert_used: int
    n_embd: int | None
    n_vocab: int | None
    layers: list[Layer]
    embeddings_bytes: int
    output_bytes: int  # the output matrix a step reads: ``output`` or the tied token embedding
    output_elements: int
    output_tied: bool
    quant_types: dict  # quant type -> bytes
    total_bytes: int
    unclassified: dict = field(default_factory=dict)  # tensor name -> bytes (kept out of every term)
    warnings: list = field(default_factory=list)

    @property
    def moe(self) -> bool:
        return self.n_expert > 0 and any(lay.bytes["experts"] for lay in self.trunk)

    @property
    def trunk(self) -> list[Layer]:
        return [lay for lay in self.layers if not lay.nextn]

    @property
    def nextn_bytes(self) -> int:
        return sum(sum(lay.bytes.values()) for lay in self.layers if lay.nextn)

    def expert_bytes(self, layer: Layer) -> float:
        """Bytes of one routed expert in ``layer``."""
        return layer.bytes["experts"] / self.n_expert if self.n_expert else 0.0

    def summary(self) -> dict:
        """Totals per category over the trunk, in bytes (what `labkit plan` prints)."""
        tot = {c: sum(lay.bytes[c] for lay in self.trunk) for c in CATEGORIES}
        return {"architecture": self.architecture, "n_layer": self.n_layer, "n_nextn": self.n_nextn,
                "n_expert": self.n_expert, "n_expert_used": self.n_expert_used, **{f"{c}_bytes": v for c, v in tot.items()},
                "expert_bytes_per_expert": (tot["experts"] / self.n_expert if self.n_expert else 0),
                "embeddings_bytes": self.embeddings_bytes, "output_bytes": self.output_bytes,
                "output_tied": self.output_tied, "nextn_bytes": self.nextn_bytes, "total_bytes": self.total_bytes,
                "quant_types": self.quant_types, "unclassified_tensors": len(self.unclassified),
                "unclassified_bytes": sum(self.unclassified.values())}

    def to_dict(self) -> dict:
        d = asdict(self)
        d["moe"] = self.moe
        return d


def _known_architectures() -> set[str]:
    import gguf

    return set(gguf.MODEL_ARCH_NAMES.values())


def tensor_bytes(ne: tuple, qtype) -> int:
    """Bytes of a tensor of GGUF shape ``ne`` stored as ``qtype`` (blocks of the row)."""
    import gguf

    block, size = gguf.GGML_QUANT_SIZES[qtype]
    n = int(np.prod(ne)) if ne else 1
    return n // block * size


def _read_header(path: str) -> tuple[dict, list[tuple[str, tuple, object]]]:
    """(metadata, [(name, ne, quant type)]) from the header; tensor data is never read."""
    import gguf

    size = os.path.getsize(path)
    if size < 24:
        raise LabkitError(f"{path} is too short to be a GGUF ({size} bytes)", "point --model at a .gguf model file")
    mm = np.memmap(path, dtype=np.uint8, mode="r")
    buf = memoryview(mm)
    if bytes(buf[:4]) != b"GGUF":
        raise LabkitError(f"{path} is not a GGUF file (no GGUF magic)", "point --model at a .gguf model file")
    off = 24
    try:
        version, n_tensors, n_kv = struct.unpack_from("<IQQ", buf, 4)
        if version < 2:
            raise LabkitError(f"{path}: GGUF version {version} is too old", "reconvert it with a current llama.cpp")
        kv = {}
        for _ in range(n_kv):
            name, off = gguf_meta._str(buf, off)
            (vtype,) = struct.unpack_from("<I", buf, off)
            kv[name], off, _ = gguf_meta._value(buf, off + 4, vtype)
        infos = []
        for _ in range(n_tensors):
            name, off = gguf_meta._str(buf, off)
            (n_dims,) = struct.unpack_from("<I", buf, off)
            dims = struct.unpack_from(f"<{n_dims}Q", buf, off + 4)
            (ttype,) = struct.unpack_from("<I", buf, off + 4 + 8 * n_dims)
            off += 4 + 8 * n_dims + 12
            infos.append((name if isinstance(name, str) else name.decode("latin-1"), tuple(int(d) for d in dims),
                          gguf.GGMLQuantizationType(ttype)))
    except (struct.error, IndexError, ValueError, OverflowError, MemoryError) as e:
        raise LabkitError(f"{path}: the GGUF header is truncated or corrupt near byte {off} of {size} ({e})",
                          "re-download or re-convert the file; a header-only GGUF must still hold the whole "
                          "metadata and tensor table") from None
    return kv, infos


def read_profile(path: str | os.PathLike) -> ModelProfile:
    """Profile the GGUF at ``path`` from its header (see the module doc)."""
    path = str(path)
    if not os.path.isfile(path):
        raise LabkitError(f"model file not found: {path}", "point --model at a .gguf file (a header-only one will do)")
    kv, infos = _read_header(path)
    arch = kv.get("general.architecture") or "unknown"
    if isinstance(arch, bytes):
        arch = arch.decode("latin-1")

    def meta(key, default=0):
        v = kv.get(f"{arch}.{key}", default)
        return int(v) if v is not None else default

    blocks = meta("block_count")
    n_nextn = meta("nextn_predict_layers")
    n_expert, n_used = meta("expert_count"), meta("expert_used_count")
    layers = [Layer(i, nextn=i >= blocks - n_nextn) for i in range(blocks)]
    emb = out = out_el = 0
    emb_el = 0
    quant: dict = {}
    unclassified: dict = {}
    total = 0
    for name, ne, qt in infos:
        nb = tensor_bytes(ne, qt)
        total += nb
        quant[qt.name] = quant.get(qt.name, 0) + nb
        m = _BLK.match(name)
        if m:
            i, rest = int(m.group(1)), m.group(2)
            cat = next((c for c, rx in _RULES if rx.search(rest)), None)
            if i >= len(layers):
                layers += [Layer(j) for j in range(len(layers), i + 1)]
            if cat is None:
                unclassified[name] = nb
                continue
            lay = layers[i]
            if cat == "nextn":
                lay.nextn = True
                cat = "attention"  # a nextn block's own projections: counted with the block (all MTP)
            lay.bytes[cat] += nb
            lay.elements[cat] += int(np.prod(ne))
            continue
        base = name.removesuffix(".weight").removesuffix(".bias")
        cat = _TOP.get(base)
        if cat == "embeddings":
            emb += nb
            emb_el = max(emb_el, int(np.prod(ne))) if base == "token_embd" else emb_el
        elif cat == "output":
            out, out_el = out + nb, out_el + int(np.prod(ne))
        elif cat is None:
            unclassified[name] = nb
    tied = out == 0 and emb > 0
    if tied:  # gemma and friends: the output layer multiplies by the token embedding
        out = next((tensor_bytes(ne, qt) for n, ne, qt in infos if n == "token_embd.weight"), emb)
        out_el = emb_el
    known = arch in _known_architectures()
    warnings = []
    if not known:
        warnings.append(f"architecture {arch!r} is not one labkit's reader knows: tensors classified by name only")
    if unclassified:
        shown = ", ".join(list(unclassified)[:8]) + (" …" if len(unclassified) > 8 else "")
        warnings.append(f"{len(unclassified)} tensors ({sum(unclassified.values()) / 1e6:.1f} MB) not classified and "
                        f"left out of the plan: {shown}")
    if n_expert and not any(lay.bytes["experts"] for lay in layers):
        warnings.append(f"{arch}.expert_count = {n_expert} but no routed expert tensors were found")
    trunk = sum(1 for lay in layers if not lay.nextn)
    vocab = kv.get(f"{arch}.vocab_size") or (len(kv["tokenizer.ggml.tokens"]) if "tokenizer.ggml.tokens" in kv else None)
    return ModelProfile(
        path=path, architecture=arch, known_architecture=known, n_layer=trunk, n_nextn=len(layers) - trunk,
        n_expert=n_expert, n_expert_used=n_used, n_embd=meta("embedding_length") or None,
        n_vocab=int(vocab) if vocab else None, layers=layers, embeddings_bytes=emb, output_bytes=out,
        output_elements=out_el, output_tied=tied, quant_types=quant, total_bytes=total,
        unclassified=unclassified, warnings=warnings)


def write_header_only(path, *, arch: str, tensors: list[tuple[str, tuple, str]], metadata: dict) -> str:
    """Write a GGUF with metadata and tensor infos but no tensor data (to profile layouts too
    big for this box). ``tensors``: (name, GGUF ne, quant type name); ``metadata``: key -> int/float/str."""
    import gguf

    w = gguf.GGUFWriter(str(path), arch)
    for k, v in metadata.items():
        if isinstance(v, bool):
            w.add_bool(k, v)
        elif isinstance(v, int):
            w.add_uint32(k, v)
        elif isinstance(v, float):
            w.add_float32(k, v)
        else:
            w.add_string(k, str(v))
    for name, ne, qt in tensors:
        qtype = gguf.GGMLQuantizationType[qt]
        np_shape = tuple(reversed(ne))
        byte_shape = gguf.quant_shape_to_byte_shape(np_shape, qtype) if qt not in ("F32", "F16") else np_shape
        dtype = {"F32": np.float32, "F16": np.float16}.get(qt, np.uint8)
        w.add_tensor_info(name, byte_shape, np.dtype(dtype), tensor_bytes(ne, qtype), raw_dtype=qtype)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_ti_data_to_file()
    w.close()
    return str(path)


def layout(*, arch: str, n_layer: int, n_embd: int, n_head: int, n_head_kv: int, n_vocab: int,
           n_ff: int = 0, n_expert: int = 0, n_expert_used: int = 0, n_ff_exp: int = 0, n_expert_shared: int = 0,
           n_dense_lead: int = 0, n_nextn: int = 0, mla_rank: int = 0, qtype: str = "Q4_K",
           tied: bool = False) -> tuple[list, dict]:
    """(tensors, metadata) of a llama.cpp-style decoder, for :func:`write_header_only`:
    a dense llama/qwen3, a Qwen3-MoE (``n_expert``), a DeepSeek-style MoE (``mla_rank``
    for MLA attention, ``n_expert_shared``, ``n_dense_lead`` leading dense blocks,
    ``n_nextn`` MTP blocks after the trunk)."""
    hd = n_embd // n_head
    t = [("token_embd.weight", (n_embd, n_vocab), qtype), ("output_norm.weight", (n_embd,), "F32")]
    if not tied:
        t.append(("output.weight", (n_embd, n_vocab), "Q6_K" if qtype.endswith("_K") else qtype))
    for i in range(n_layer + n_nextn):
        b = f"blk.{i}."
        t.append((b + "attn_norm.weight", (n_embd,), "F32"))
        if mla_rank:
            t += [(b + "attn_q_a.weight", (n_embd, mla_rank), qtype), (b + "attn_q_b.weight", (mla_rank, n_head * hd), qtype),
                  (b + "attn_kv_a_mqa.weight", (n_embd, mla_rank // 3 + 64), qtype),
                  (b + "attn_kv_b.weight", (mla_rank // 3, 2 * n_head * hd), qtype),
                  (b + "attn_q_a_norm.weight", (mla_rank,), "F32"), (b + "attn_kv_a_norm.weight", (mla_rank // 3,), "F32")]
        else:
            t += [(b + "attn_q.weight", (n_embd, n_head * hd), qtype), (b + "attn_k.weight", (n_embd, n_head_kv * hd), qtype),
                  (b + "attn_v.weight", (n_embd, n_head_kv * hd), qtype)]
        t += [(b + "attn_output.weight", (n_head * hd, n_embd), qtype), (b + "ffn_norm.weight", (n_embd,), "F32")]
        if not n_expert or i < n_dense_lead:
            t += [(b + f"ffn_{p}.weight", (n_embd, n_ff), qtype) for p in ("gate", "up")]
            t.append((b + "ffn_down.weight", (n_ff, n_embd), qtype))
        else:
            t.append((b + "ffn_gate_inp.weight", (n_embd, n_expert), "F32"))
            t += [(b + f"ffn_{p}_exps.weight", (n_embd, n_ff_exp, n_expert), qtype) for p in ("gate", "up")]
            t.append((b + "ffn_down_exps.weight", (n_ff_exp, n_embd, n_expert), qtype))
            if n_expert_shared:
                f = n_ff_exp * n_expert_shared
                t += [(b + f"ffn_{p}_shexp.weight", (n_embd, f), qtype) for p in ("gate", "up")]
                t.append((b + "ffn_down_shexp.weight", (f, n_embd), qtype))
        if i >= n_layer:
            t += [(b + "nextn.eh_proj.weight", (2 * n_embd, n_embd), qtype), (b + "nextn.enorm.weight", (n_embd,), "F32"),
                  (b + "nextn.hnorm.weight", (n_embd,), "F32")]
    md = {f"{arch}.block_count": n_layer + n_nextn, f"{arch}.embedding_length": n_embd,
          f"{arch}.attention.head_count": n_head, f"{arch}.attention.head_count_kv": n_head_kv,
          f"{arch}.vocab_size": n_vocab, f"{arch}.feed_forward_length": n_ff or n_ff_exp}
    if n_expert:
        md |= {f"{arch}.expert_count": n_expert, f"{arch}.expert_used_count": n_expert_used,
               f"{arch}.expert_feed_forward_length": n_ff_exp}
    if n_expert_shared:
        md[f"{arch}.expert_shared_count"] = n_expert_shared
    if n_dense_lead:
        md[f"{arch}.leading_dense_block_count"] = n_dense_lead
    if n_nextn:
        md[f"{arch}.nextn_predict_layers"] = n_nextn
    return t, md
