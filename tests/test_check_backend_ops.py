"""benchmarks/check_backend_ops.py reads test-backend-ops' output: recorded from real runs
(2026-12-04, family 26) of the patched tree (every MUL_MAT case of the patch's types
passes) and of the same tree with one column's result scaled by 1.1 on purpose (n = 3..8
fail). Building and running the check itself takes minutes and OpenBLAS: it is a benchmark
script, run by hand (docs/engines.md)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from labkit.engines import native
from labkit.errors import LabkitError
from labkit.paths import cache_dir

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))
import check_backend_ops as cbo  # noqa: E402

FIX = Path(__file__).parent / "fixtures" / "backend_ops"


def test_a_passing_run_is_read_case_by_case_and_passes():
    s = cbo.summarize(cbo.parse((FIX / "pass.out").read_text()))
    assert not s["fail"] and s["touched_ok"] == 96
    for t in cbo.TOUCHED:
        assert set(range(1, 10)) <= set(s["per_type"][t]["ok"]), t
    assert s["per_type"]["q8_0"]["cases"] == 46 and s["per_type"]["q8_0"]["cases_ok"] == 36  # 10 BLAS does not take
    good, missing = cbo.verdict(s, 0)
    assert good and not missing
    assert not cbo.verdict(s, 1)[0]  # test-backend-ops' own exit code counts too


def test_failed_cases_are_read_with_their_error_and_fail_the_check():
    s = cbo.summarize(cbo.parse((FIX / "fail.out").read_text()))
    assert s["per_type"]["q8_0"]["fail"] == [3, 4, 5, 6, 7, 8]
    assert s["per_type"]["q8_0"]["ok"] == [1, 2, 9, 16]
    assert len(s["fail"]) == 34 and all("ERR = " in c for c in s["fail"])
    assert not cbo.verdict(s, 0)[0]


def test_a_column_count_no_case_ran_fails_the_check():
    text = "\n".join(ln for ln in (FIX / "pass.out").read_text().splitlines() if "type_a=iq4_nl" not in ln
                     or ",n=5," not in ln)
    good, missing = cbo.verdict(cbo.summarize(cbo.parse(text)), 0)
    assert not good and missing == {"iq4_nl": [5]}


@pytest.mark.slow  # unpacks the pinned 77 MB sdist twice
def test_the_check_trees_are_the_pinned_sources_with_and_without_the_patches(tmp_path):
    """The same unpacking the engine's build uses (native.extract_source): the patched tree has
    labkit's patch, the unpatched one not; both take BLAS from one column; a tree is kept."""
    log = tmp_path / "check.log"
    patched = cbo.tree(tmp_path, patched=True, log=log)
    plain = cbo.tree(tmp_path, patched=False, log=log)
    sgemm = "ggml/src/ggml-cpu/llamafile/sgemm.cpp"
    assert "gemm1xN<8, 8>" in (patched / sgemm).read_text() and "gemm1xN<8, 8>" not in (plain / sgemm).read_text()
    for t in (patched, plain):
        assert "min_batch = 1;  // labkit check" in (t / "ggml/src/ggml-blas/ggml-blas.cpp").read_text()
    assert cbo.tree(tmp_path, patched=True, log=log) == patched


@pytest.mark.slow  # unpacks the pinned 77 MB sdist
def test_a_tree_whose_edit_fails_is_not_left_half_made(tmp_path):
    def moved(vendored: Path) -> None:
        raise LabkitError("the sources moved", "update the edit")

    sdist = native._sdist(cache_dir(), tmp_path / "log", None)
    with pytest.raises(LabkitError, match="the sources moved"):
        native.extract_source(sdist, tmp_path / "t" / "src", tmp_path / "log", edit=moved)
    assert not (tmp_path / "t" / "src").exists() and list((tmp_path / "t").iterdir()) == []
