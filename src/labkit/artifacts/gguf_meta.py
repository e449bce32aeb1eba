"""Read a GGUF's metadata and tensor table fast; tensor data stays memory-mapped.

``gguf.GGUFReader`` (0.19) parses every array element through its own numpy views: a
gemma tokenizer (262,144 strings, scores and types) takes it ~10 s on an idle 2-core
machine and minutes on a busy one, and the MLX converter and the synthetic gemma3
writer each read one. Here numeric arrays are one ``np.frombuffer`` and strings one
``struct`` loop (well under a second for the same file).

Values are what ``ReaderField.contents()`` returns: Python scalars, ``str`` (bytes when
not valid UTF-8, so a copy stays exact), lists for arrays. Tensor ``data`` has
GGUFReader's numpy shape and dtype (the reverse of GGUF ``ne``; quantized types as
uint8 rows of blocks), so ``gguf.quants.dequantize(t.data, t.tensor_type)`` works on it.
"""

from __future__ import annotations

import os
import struct
from dataclasses import dataclass
from typing import Any

import numpy as np

from labkit.errors import LabkitError

_SCALARS = {  # GGUFValueType -> (struct format, numpy dtype)
    0: ("<B", np.uint8), 1: ("<b", np.int8), 2: ("<H", np.uint16), 3: ("<h", np.int16),
    4: ("<I", np.uint32), 5: ("<i", np.int32), 6: ("<f", np.float32), 7: ("<?", np.bool_),
    10: ("<Q", np.uint64), 11: ("<q", np.int64), 12: ("<d", np.float64),
}
_STRING, _ARRAY = 8, 9
_PLAIN = {"F32": np.float32, "F16": np.float16, "F64": np.float64,
          "I8": np.int8, "I16": np.int16, "I32": np.int32, "I64": np.int64}


@dataclass(frozen=True)
class KV:
    name: str
    type: Any  # gguf.GGUFValueType
    sub_type: Any  # gguf.GGUFValueType of an array's items, else None
    value: Any


@dataclass(frozen=True)
class Tensor:
    name: str
    tensor_type: Any  # gguf.GGMLQuantizationType
    shape: tuple  # GGUF ne (innermost first), as GGUFReader's ``shape``
    data: np.ndarray


@dataclass
class GgufFile:
    path: str
    version: int
    kv: dict[str, KV]
    tensors: list[Tensor]
    data_offset: int  # where tensor data starts: after the tensor table, at the file's alignment

    def get(self, key: str, default=None):
        kv = self.kv.get(key)
        return kv.value if kv is not None else default


def _str(buf, off: int) -> tuple[str | bytes, int]:
    (n,) = struct.unpack_from("<Q", buf, off)
    raw = bytes(buf[off + 8 : off + 8 + n])
    try:
        return raw.decode("utf-8"), off + 8 + n
    except UnicodeDecodeError:
        return raw, off + 8 + n


def _value(buf, off: int, vtype: int) -> tuple[Any, int, int | None]:
    """(value, next offset, array item type) of one value at ``off``."""
    if vtype == _STRING:
        v, off = _str(buf, off)
        return v, off, None
    if vtype in _SCALARS:
        fmt, _ = _SCALARS[vtype]
        (v,) = struct.unpack_from(fmt, buf, off)
        return v, off + struct.calcsize(fmt), None
    if vtype != _ARRAY:
        raise ValueError(f"unknown GGUF value type {vtype}")
    itype, count = struct.unpack_from("<IQ", buf, off)
    off += 12
    if itype in _SCALARS:
        dt = np.dtype(_SCALARS[itype][1]).newbyteorder("<")
        arr = np.frombuffer(buf, dtype=dt, count=count, offset=off)
        return arr.tolist(), off + arr.nbytes, itype
    items = []
    for _ in range(count):  # strings (or nested arrays): one at a time
        v, off, _ = _value(buf, off, itype)
        items.append(v)
    return items, off, itype


def read(path: str | os.PathLike) -> GgufFile:
    """Parse ``path``'s header, metadata and tensor table (data stays on disk, memory-mapped)."""
    import gguf

    mm = np.memmap(path, dtype=np.uint8, mode="r")
    buf = memoryview(mm)
    if bytes(buf[:4]) != b"GGUF":
        raise LabkitError(f"{path} is not a GGUF file", "point at a .gguf model file")
    version, n_tensors, n_kv = struct.unpack_from("<IQQ", buf, 4)
    if version < 2:
        raise LabkitError(f"{path}: GGUF version {version} is too old", "reconvert the model with a current llama.cpp")
    off = 24
    kv: dict[str, KV] = {}
    for _ in range(n_kv):
        name, off = _str(buf, off)
        (vtype,) = struct.unpack_from("<I", buf, off)
        value, off, itype = _value(buf, off + 4, vtype)
        kv[name] = KV(name, gguf.GGUFValueType(vtype), gguf.GGUFValueType(itype) if itype is not None else None,
                      value)
    infos = []
    for _ in range(n_tensors):
        name, off = _str(buf, off)
        (n_dims,) = struct.unpack_from("<I", buf, off)
        dims = struct.unpack_from(f"<{n_dims}Q", buf, off + 4)
        ttype, t_off = struct.unpack_from("<IQ", buf, off + 4 + 8 * n_dims)
        off += 4 + 8 * n_dims + 12
        infos.append((name, tuple(int(d) for d in dims), gguf.GGMLQuantizationType(ttype), t_off))
    align = int(kv["general.alignment"].value) if "general.alignment" in kv else gguf.GGUF_DEFAULT_ALIGNMENT
    start = off + (-off % align)
    tensors = []
    for name, dims, ttype, t_off in infos:
        np_shape = tuple(reversed(dims))
        n = int(np.prod(dims))
        if ttype.name in _PLAIN:
            dt = np.dtype(_PLAIN[ttype.name])
            data = np.frombuffer(buf, dtype=dt, count=n, offset=start + t_off).reshape(np_shape)
        else:  # quantized (and BF16): rows of blocks as bytes, as GGUFReader gives them
            block, size = gguf.GGML_QUANT_SIZES[ttype]
            byte_shape = gguf.quant_shape_to_byte_shape(np_shape, ttype)
            data = np.frombuffer(buf, dtype=np.uint8, count=n // block * size, offset=start + t_off)
            data = data.reshape(byte_shape)
        tensors.append(Tensor(name, ttype, dims, data))
    return GgufFile(str(path), version, kv, tensors, start)
