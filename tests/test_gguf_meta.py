"""labkit.artifacts.gguf_meta: the fast GGUF reader returns what gguf.GGUFReader returns.

A small GGUF with every value type, string arrays (non-ASCII and empty strings included),
a custom alignment and tensors of plain and quantized types is read by both readers and
compared field by field and byte by byte. (The embedded model itself is read by the MLX
tests' conversion and the synthetic gemma3 tests; GGUFReader on its 262k-token vocabulary
is the slow path this module exists to avoid.)
"""

from __future__ import annotations

import gguf
import numpy as np
import pytest

from labkit.artifacts import gguf_meta
from labkit.errors import LabkitError

T = gguf.GGMLQuantizationType


@pytest.fixture(scope="module")
def sample(tmp_path_factory):
    path = tmp_path_factory.mktemp("gguf") / "sample.gguf"
    rng = np.random.default_rng(7)
    w = gguf.GGUFWriter(str(path), "gemma3")
    w.add_custom_alignment(1024)  # not the default 32: the data offset must follow it
    w.add_uint8("t.u8", 200)
    w.add_int8("t.i8", -7)
    w.add_uint16("t.u16", 60000)
    w.add_int16("t.i16", -30000)
    w.add_uint32("t.u32", 4_000_000_000)
    w.add_int32("t.i32", -2_000_000_000)
    w.add_float32("t.f32", 0.1)
    w.add_uint64("t.u64", 2**63 + 5)
    w.add_int64("t.i64", -(2**62))
    w.add_float64("t.f64", 1e-300)
    w.add_bool("t.bool", True)
    w.add_string("t.str", "héllo ▁wörld 你好")
    w.add_array("t.strs", ["", "a", "▁the", "你好", "<unused99>", "\n"])
    w.add_array("t.ints", [3, -1, 7])
    w.add_array("t.floats", [0.5, -2.25, 1e9])
    w.add_array("t.bools", [True, False, True])
    w.add_key_value("t.u8s", [1, 2, 255], gguf.GGUFValueType.ARRAY, sub_type=gguf.GGUFValueType.UINT8)
    w.add_tensor("f32", rng.standard_normal((3, 5), dtype=np.float32))
    w.add_tensor("f16", rng.standard_normal((2, 7)).astype(np.float16))
    w.add_tensor("i32", rng.integers(-9, 9, (4,), dtype=np.int32))
    for qt, shape in [(T.Q8_0, (3, 64)), (T.Q4_0, (2, 96)), (T.Q5_0, (2, 64)), (T.BF16, (2, 8))]:
        x = rng.standard_normal(shape, dtype=np.float32)
        w.add_tensor(qt.name.lower(), gguf.quants.quantize(x, qt), raw_dtype=qt)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def test_fields_equal_ggufreader(sample):
    ref = gguf.GGUFReader(str(sample))
    got = gguf_meta.read(sample)
    ref_fields = {k: f for k, f in ref.fields.items() if not k.startswith("GGUF.")}
    assert list(got.kv) == list(ref_fields)  # same keys, same order
    for name, f in ref_fields.items():
        kv = got.kv[name]
        assert kv.type == f.types[0], name
        assert kv.sub_type == (f.types[-1] if f.types[0] == gguf.GGUFValueType.ARRAY else None), name
        assert kv.value == f.contents(), name
        assert type(kv.value) is type(f.contents()), name
    assert got.get("t.strs")[3] == "你好" and got.get("general.alignment") == 1024
    assert got.get("missing", "default") == "default"
    assert got.version == int(ref.fields["GGUF.version"].contents())


def test_tensors_equal_ggufreader(sample):
    ref = gguf.GGUFReader(str(sample))
    got = gguf_meta.read(sample)
    assert [t.name for t in got.tensors] == [t.name for t in ref.tensors]
    assert got.data_offset == ref.data_offset and got.data_offset % 1024 == 0
    for a, b in zip(got.tensors, ref.tensors):
        assert a.tensor_type == b.tensor_type, a.name
        assert a.shape == tuple(int(d) for d in b.shape), a.name
        assert a.data.dtype == b.data.dtype and a.data.shape == b.data.shape, a.name
        assert np.array_equal(a.data, b.data), a.name
        if a.tensor_type != T.I32:  # what the MLX converter does with every tensor
            deq = gguf.quants.dequantize(a.data, a.tensor_type)
            assert deq.shape == tuple(reversed(a.shape)), a.name
            assert np.array_equal(deq, gguf.quants.dequantize(b.data, b.tensor_type)), a.name


def test_a_copy_through_the_writer_is_exact(sample, tmp_path):
    """What the MLX converter and the synthetic gemma3 writer do: copy keys into a new file."""
    src = gguf_meta.read(sample)
    out = tmp_path / "copy.gguf"
    w = gguf.GGUFWriter(str(out), "gemma3")
    for kv in src.kv.values():
        if kv.name not in ("general.architecture", "general.alignment"):
            w.add_key_value(kv.name, kv.value, kv.type, sub_type=kv.sub_type)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_ti_data_to_file()
    w.close()
    again = gguf_meta.read(out)
    for name, kv in src.kv.items():
        if name != "general.alignment":
            assert again.kv[name] == kv, name


def test_not_a_gguf_is_a_clear_error(tmp_path):
    bad = tmp_path / "model.gguf"
    bad.write_bytes(b"PK\x03\x04 not a gguf at all, padded to a header's length" + bytes(32))
    with pytest.raises(LabkitError, match="not a GGUF file"):
        gguf_meta.read(bad)
