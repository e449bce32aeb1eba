"""Benchmark: the one llama.cpp build, compiled file by file against labkit's unity build.

``make setup`` compiles llama.cpp once per machine; with nothing cached it is most of the
setup of ``make test`` and ``make reproduce``. labkit compiles llama-common and mtmd as CMake
unity builds (``native.UNITY_TARGETS``), keeping a compile of their own for the files a token
passes through (``native.UNITY_OWN``). This measures what that saves and checks what it must
not change.

Each round configures and builds labkit's targets (``native.LIBS`` and ``native.TOOLS``) twice
from scratch, from the installed build's own sources and flags, into a throwaway folder: once
file by file (the pinned CMakeLists as they are) and once with the unity build; which arm goes
first alternates between rounds. Reported:
- the wall time of each arm, and the ratio unity / file by file with its 95% CI
  (``analysis.decide.estimate``, the rounds as prompts);
- for every library and tool, whether the two arms made the same bytes (sha256), and the
  same for the objects of the files UNITY_OWN keeps apart.
Prints JSON as its last line. Each round takes ~8 minutes on 2 cores; nothing else should run.

    python benchmarks/bench_build.py [--rounds 2] [--jobs N]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

import pandas as pd

from labkit.analysis import decide
from labkit.engines import native
from labkit.errors import LabkitError


def _build(src: Path, out: Path, flags: str, include: list[str], jobs: int) -> float:
    """Configure (with ``include``: the unity build's arguments, or none) and build labkit's
    targets from ``src`` into ``out`` (fresh); wall seconds."""
    shutil.rmtree(out, ignore_errors=True)
    out.mkdir(parents=True)
    log = out.with_suffix(".log")
    t0 = time.perf_counter()
    native._run(native.configure_command(src, out, flags, gen=native.generator(), extra=include), log)
    native._run(["cmake", "--build", str(out), "--target", *native.LIBS, *native.TOOLS, f"-j{jobs}"], log)
    return time.perf_counter() - t0


def _sums(out: Path) -> dict[str, str]:
    files = {n: p.resolve() for n, p in native._artifacts(out / "bin").items()}
    own = {f"{t}:{f}": next(out.rglob(f"{t}.dir/{Path(f).name}.o"), None)
           for t, fs in native.UNITY_OWN.items() for f in fs}
    return {n: native.sha256(p) if p and p.is_file() else "missing" for n, p in {**files, **own}.items()}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rounds", type=int, default=2, help="pairs of builds (default 2; ~8 minutes each on 2 cores)")
    p.add_argument("--jobs", type=int, default=os.cpu_count() or 2)
    args = p.parse_args(argv)
    if args.rounds < 2:
        p.error(f"--rounds {args.rounds}: use 2 or more (an interval needs two pairs)")
    try:
        info = native.find(verify=True)
        if info is None or info["missing"]:
            raise LabkitError(f"no finished labkit llama.cpp build in {native.build_dir()}", "run `make setup`")
        why = native.unity_unsupported()
        if why:
            raise LabkitError(f"no unity build to compare: {why}", "install a newer cmake (pip install cmake), then rerun")
    except LabkitError as e:
        print(f"error: {e.problem}\nfix: {e.fix}", file=sys.stderr)
        return 2
    src = Path(info["dir"]) / "src"
    rows, seen, differ = [], {"file": [], "unity": []}, set()
    with tempfile.TemporaryDirectory(prefix="labkit-bench-build-") as d:
        include = native.unity_args(Path(d))
        for i in range(args.rounds):
            got, sums = {}, {}
            for arm in (("unity", "file") if i % 2 else ("file", "unity")):
                try:
                    got[arm] = _build(src, Path(d) / arm, info["cmake_args"], include if arm == "unity" else [],
                                      args.jobs)
                except LabkitError as e:
                    print(f"error: the {arm} build failed: {e.problem}\nfix: {e.fix}", file=sys.stderr)
                    return 2
                sums[arm] = _sums(Path(d) / arm)
                print(f"round {i + 1}: {arm} {got[arm]:.0f} s", file=sys.stderr, flush=True)
            differ |= {n for n in sums["file"] if sums["file"][n] != sums["unity"][n]}
            for arm in got:
                seen[arm].append(got[arm])
            rows.append({"prompt": f"round-{i}", "round": 1, "ratio": got["unity"] / got["file"]})
    est = decide.estimate(pd.DataFrame(rows), margin=0.02, confidence=0.95)
    same = sorted(set(sums["file"]) - differ)
    out = {"benchmark": "build", "host": platform.node(), "cpu_count": os.cpu_count(), "jobs": args.jobs,
           "rounds": args.rounds, "llama_cpp_commit": info["llama_cpp_commit"], "cmake_args": info["cmake_args"],
           "unity": native.unity(), "median_s_file": round(statistics.median(seen["file"]), 1),
           "median_s_unity": round(statistics.median(seen["unity"]), 1),
           "seconds": {k: [round(x, 1) for x in v] for k, v in seen.items()},
           "ratio": round(est.ratio, 3), "ci95": [round(est.lo, 3), round(est.hi, 3)], "text": est.ci_text(),
           "identical": same, "different": sorted(differ)}
    print(f"unity / file by file: {est.ci_text()} ({out['median_s_unity']:.0f} s against {out['median_s_file']:.0f} s); "
          f"identical: {', '.join(same)}; different: {', '.join(sorted(differ)) or 'none'}", file=sys.stderr)
    print(json.dumps(out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
