"""Check: llama.cpp's own ``test-backend-ops`` on the ops labkit's patch touches (MUL_MAT).

``test-backend-ops`` compares a backend against the CPU backend, and skips the CPU backend
itself: on a CPU-only box it has nothing to compare, and ``-b CPU`` compares the CPU backend
with itself. So this builds the CPU backend *with* labkit's patches (the one under test: it
is the reference ``test-backend-ops`` compares to) beside ggml's BLAS backend (OpenBLAS:
dequantize the weights to f32, then sgemm), an independent path, and runs
``test-backend-ops -m test -b BLAS -o MUL_MAT``. ggml-blas takes a matmul only when every
side is at least 32 (``min_batch``) and leaves smaller ones to the CPU; in this check's tree,
and only there, that floor is 1, so BLAS computes the 1..9-column cases the patch changes.
The comparison is test-backend-ops' own (normalized mean squared error under its threshold).

    python benchmarks/check_backend_ops.py [--unpatched] [--work DIR] [--jobs N]

Needs ``libopenblas-dev`` (``apt-get install -y libopenblas-dev``), CMake and g++. Builds
in ``--work`` (default: the labkit cache's ``backend-ops/``; about 4 minutes per tree on 2
cores, kept for the next run), with the installed build's flags (its build.json).
``--unpatched`` runs the same on the pinned sources without labkit's patches, beside.
Prints what passed per weight type and column count, JSON as its last line; exit 1 when a
case fails, or when a column count 1..9 of a type the patch touches has no case BLAS ran
(cases BLAS does not take, non-contiguous ones, stay with the CPU and are counted apart).
"""

from __future__ import annotations

import argparse
import json
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

from labkit.errors import LabkitError

TOUCHED = ("q8_0", "q4_0", "q5_0", "iq4_nl")  # tinyBLAS_Q0_AVX's types (the patch's header)
# "  MUL_MAT(type_a=q8_0,...,n=3,...): OK"; a failure is prefixed "[MUL_MAT] ERR = 0.0043 > 0.0005   "
CASE = re.compile(r"^(?:\[MUL_MAT\] (?P<err>\w+ = [0-9.e+-]+ > [0-9.e+-]+))?\s*MUL_MAT\((?P<params>[^)]*)\):\s*"
                  r"(?P<result>OK|FAIL|not supported)")
ANSI = re.compile(r"\x1b\[[0-9;]*m")  # test-backend-ops colours OK and FAIL


def _blas_floor_1(vendored: Path) -> None:
    """ggml-blas takes a matmul only from 32 columns; the reference must take every n."""
    blas = vendored / "ggml" / "src" / "ggml-blas" / "ggml-blas.cpp"
    text = blas.read_text()
    if "const int64_t min_batch = 32;" not in text:
        raise LabkitError(f"{blas} no longer has ggml-blas's `min_batch = 32`: this check's reference cannot "
                          "take small batches", "update benchmarks/check_backend_ops.py to the new sources")
    blas.write_text(text.replace("const int64_t min_batch = 32;", "const int64_t min_batch = 1;  // labkit check"))


def tree(work: Path, *, patched: bool, log: Path) -> Path:
    """The pinned llama.cpp sources, with labkit's patches or without, and ggml-blas's floor at 1."""
    from labkit.engines import native
    from labkit.paths import cache_dir

    # keyed by the patches' checksums: a changed patch gets a tree of its own, never a stale one
    tag = "-".join(p["sha256"][:8] for p in native.patches()) if patched else ""
    src = work / (f"patched-{tag}" if patched else "unpatched") / "src"
    if not (src / "CMakeLists.txt").is_file():
        native.extract_source(native._sdist(cache_dir(), log, None), src, log, patched=patched, edit=_blas_floor_1)
    return src


def build(src: Path, ggml_flags: str, *, jobs: int, log: Path) -> Path:
    from labkit.engines.native import _run

    b = src.parent / "build"
    exe = b / "bin" / "test-backend-ops"
    gen = ["-G", "Ninja"] if shutil.which("ninja") else []
    _run(["cmake", "-S", str(src), "-B", str(b), *gen, *ggml_flags.split(), "-DCMAKE_BUILD_TYPE=Release",
          "-DGGML_BLAS=ON", "-DGGML_BLAS_VENDOR=OpenBLAS", "-DLLAMA_BUILD_TESTS=ON", "-DLLAMA_CURL=OFF",
          "-DLLAMA_OPENSSL=OFF", "-DLLAMA_BUILD_SERVER=OFF", "-DLLAMA_BUILD_TOOLS=OFF",
          "-DLLAMA_BUILD_EXAMPLES=OFF"], log)
    _run(["cmake", "--build", str(b), "--target", "test-backend-ops", f"-j{jobs}"], log)
    return exe


def parse(text: str) -> list[dict]:
    """test-backend-ops' MUL_MAT lines: weight type, columns n, rows m, k, and the result."""
    out = []
    for line in ANSI.sub("", text).splitlines():
        mm = CASE.match(line)
        if not mm:
            continue
        p = dict(kv.split("=", 1) for kv in re.findall(r"(\w+=(?:\[[^\]]*\]|[^,]*))", mm["params"]))
        out.append({"type": p.get("type_a"), "type_b": p.get("type_b"), "m": int(p.get("m", -1)),
                    "n": int(p.get("n", -1)), "k": int(p.get("k", -1)), "result": mm["result"],
                    "case": mm["params"] + (f" ({mm['err']})" if mm["err"] else "")})
    return out


def summarize(cases: list[dict]) -> dict:
    touched = [c for c in cases if c["type"] in TOUCHED and c["type_b"] == "f32" and 1 <= c["n"] <= 16]
    per = {}
    for t in TOUCHED:
        mine = [c for c in touched if c["type"] == t]
        ran = {c["n"] for c in mine if c["result"] != "not supported"}
        fail = {c["n"] for c in mine if c["result"] == "FAIL"}
        per[t] = {"ok": sorted(ran - fail), "fail": sorted(fail),
                  "not_run": sorted({c["n"] for c in mine} - ran),  # every case at this n unsupported by BLAS
                  "cases": len(mine), "cases_ok": sum(c["result"] == "OK" for c in mine)}
    return {"cases": len(cases), "ok": sum(c["result"] == "OK" for c in cases),
            "fail": [c["case"] for c in cases if c["result"] == "FAIL"],
            "not_supported": sum(c["result"] == "not supported" for c in cases),
            "touched_cases": len(touched), "touched_ok": sum(c["result"] == "OK" for c in touched), "per_type": per}


def verdict(s: dict, exit_code: int) -> tuple[bool, dict]:
    """(pass, the patch's column counts 1..9 with no case run, per type): a pass needs
    test-backend-ops' exit 0, no failed case, and every n = 1..9 of every touched type run."""
    missing = {t: sorted(set(range(1, 10)) - set(v["ok"]) - set(v["fail"])) for t, v in s["per_type"].items()}
    missing = {t: v for t, v in missing.items() if v}
    return exit_code == 0 and not s["fail"] and s["touched_ok"] > 0 and not missing, missing


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--unpatched", action="store_true", help="also run the pinned sources without labkit's patches")
    ap.add_argument("--work", type=Path, default=None, help="build folder (default: <labkit cache>/backend-ops)")
    ap.add_argument("--jobs", type=int, default=2)
    a = ap.parse_args(argv)
    from labkit.engines import native
    from labkit.paths import cache_dir

    if not any(Path(p).is_file() for p in ("/usr/include/x86_64-linux-gnu/cblas.h", "/usr/include/cblas.h",
                                              "/usr/include/openblas/cblas.h")):
        sys.exit("error: OpenBLAS's headers are not installed (no cblas.h): apt-get install -y libopenblas-dev")
    ggml_flags, flags_from = native.flags()
    work = a.work or cache_dir() / "backend-ops"
    work.mkdir(parents=True, exist_ok=True)
    log = work / "check.log"
    res = {"check": "test-backend-ops -m test -b BLAS -o MUL_MAT", "flags": ggml_flags, "flags_from": flags_from,
           "patches": [p["name"] for p in native.patches()], "trees": {}}
    ok = True
    for patched in ([True, False] if a.unpatched else [True]):
        name = "patched" if patched else "unpatched"
        t0 = time.perf_counter()
        print(f"{name}: building test-backend-ops with the CPU backend ({'labkit patches' if patched else 'no patches'}) "
              f"and OpenBLAS (log: {log})", file=sys.stderr, flush=True)
        try:
            exe = build(tree(work, patched=patched, log=log), ggml_flags, jobs=a.jobs, log=log)
        except LabkitError as e:
            sys.exit(f"error: {e.problem}\n  fix: {e.fix}")
        built = time.perf_counter() - t0
        r = subprocess.run([str(exe), "test", "-b", "BLAS", "-o", "MUL_MAT"], capture_output=True, text=True)
        (work / f"{name}.out").write_text(r.stdout + r.stderr)
        s = summarize(parse(r.stdout + r.stderr))
        s.update(exit=r.returncode, build_s=round(built, 1), output=str(work / f"{name}.out"))
        res["trees"][name] = s
        good, missing = verdict(s, r.returncode)
        s["not_run"] = missing
        ok &= good if patched else True
        print(f"{name}: {'PASS' if good else 'FAIL'}: {s['ok']} of {s['cases']} MUL_MAT cases OK against BLAS "
              f"({s['not_supported']} not supported by BLAS), {len(s['fail'])} failed; the patch's types:")
        for t, v in s["per_type"].items():
            print(f"  {t:7s} {v['cases_ok']} of {v['cases']} cases OK; n = {','.join(map(str, v['ok'])) or '-'}"
                  + (f"; FAILED n = {v['fail']}" if v["fail"] else "") + (f"; not run n = {v['not_run']}" if v["not_run"] else ""))
        for c in s["fail"][:10]:
            print(f"  FAIL {c}")
    res["pass"] = ok
    print(json.dumps(res))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
