"""benchmarks/bench_verify_kernels.py's portable reference (``--portable``): which files the
patches change, and the library folder it assembles from the installed build. Building the
unpatched libggml-cpu takes minutes: the benchmark is run by hand (docs/engines.md)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from labkit.engines import native

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))
import bench_verify_kernels as bvk  # noqa: E402


def test_the_patches_change_only_ggml_cpu():
    files = bvk.patched_files([Path(p["path"]).read_text() for p in native.patches()])
    assert files == ["ggml/src/ggml-cpu/llamafile/sgemm.cpp"]
    two = "--- a/x.c\n+++ b/ggml/src/ggml.c\t2026-01-01\n@@\n--- /dev/null\n+++ b/ggml/src/ggml-cpu/new.c\n"
    assert bvk.patched_files([two, two]) == ["ggml/src/ggml.c", "ggml/src/ggml-cpu/new.c"]


def _installed_bin() -> Path:
    info = native.find()
    if info is None:
        pytest.fail("no labkit llama.cpp build: make setup builds it before the tests")
    return Path(info["bin"])


def test_the_portable_folder_is_the_installed_one_with_another_ggml_cpu(tmp_path):
    bin_ = _installed_bin()
    other = tmp_path / "libggml-cpu.so.unpatched"
    other.write_bytes(b"not the installed bytes")
    dest = bvk.assemble(bin_, other, tmp_path / "lib")
    libs = sorted(f.name for f in bin_.iterdir() if f.name.startswith("lib") and ".so" in f.name)
    assert sorted(f.name for f in dest.iterdir()) == libs
    real = (bin_ / bvk.CPU_LIB).resolve().name
    for name in libs:
        a, b = bin_ / name, dest / name
        assert a.is_symlink() == b.is_symlink(), name
        if b.is_symlink():
            assert b.readlink() == a.readlink(), name  # relative links, as the build made them
        elif name == real:
            assert b.read_bytes() == other.read_bytes()
        else:
            assert bvk._sha(b) == bvk._sha(a), name
    assert (dest / bvk.CPU_LIB).read_bytes() == other.read_bytes()  # the link resolves to the new bytes


def test_the_installed_ggml_cpu_as_the_reference_is_refused(tmp_path):
    bin_ = _installed_bin()
    with pytest.raises(SystemExit, match="the same bytes"):
        bvk.assemble(bin_, (bin_ / bvk.CPU_LIB).resolve(), tmp_path / "lib")
    assert not (tmp_path / "lib").exists()


def test_portable_and_a_build_named_portable_is_refused():
    with pytest.raises(SystemExit, match="--portable and a build named portable= or unpatched="):
        bvk.main(["--portable", "portable=/nowhere"])


@pytest.mark.parametrize("m_max", ["7", "16"])
def test_an_m_max_below_the_targets_or_at_the_amortised_rows_is_refused(m_max):
    """--m-max times verify(m) for m = 1..M: fewer than the targets' 1..8 would drop a target,
    and m = 16 is timed already as the first of the amortised rows (the keys would collide)."""
    with pytest.raises(SystemExit, match=f"--m-max {m_max}: .*\nfix: give --m-max between 8 and 15"):
        bvk.main(["--m-max", m_max])


def test_m_max_sets_the_verify_rows_timed():
    ap_args = bvk.argparse.Namespace(m_max=12)
    assert bvk.m_values(ap_args) == tuple(range(1, 13))
    assert bvk.M_VALUES == tuple(range(1, 9))  # the targets' m stay the default
