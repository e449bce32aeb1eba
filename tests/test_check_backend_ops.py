"""benchmarks/check_backend_ops.py reads test-backend-ops' output: recorded from real runs
(2026-12-04, family 26) of the patched tree (every MUL_MAT case of the patch's types
passes) and of the same tree with one column's result scaled by 1.1 on purpose (n = 3..8
fail). Building and running the check itself takes minutes and OpenBLAS: it is a benchmark
script, run by hand (docs/engines.md)."""

from __future__ import annotations

import sys
from pathlib import Path

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
