"""Benchmark: how long a labkit process takes to exit, with and without ``labkit.teardown``.

A reproduction waits for each notebook's kernel to exit before the next notebook starts, and
every ``labkit`` command ends with an interpreter exit; the test suite starts hundreds of both.
Once MLflow's SQL store is open, CPython's last garbage collection at exit takes most of a
second on a 2-core box; ``freeze_at_exit()`` (the CLI and ``labkit.lab.start`` call it) skips it.

Two measurements, the arms interleaved in alternating order, ``--reps`` pairs each, on a
throwaway SQLite store:
- kernel: a fresh ``python3`` kernel opens the store (``tracking.client()``, as a notebook's
  start cell does), then the time from the graceful shutdown request until the kernel is gone;
- process: ``python -c`` that opens the store, from its start until it has exited.
Each ratio (with / without) is reported with its 95% CI (``analysis.decide.estimate``, the
pairs as prompts). Prints JSON as its last line.

    python benchmarks/bench_exit.py [--reps 8]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pandas as pd

from labkit.analysis import decide

OPEN = "from labkit.provenance import tracking; tracking.client()"
FREEZE = "from labkit.teardown import freeze_at_exit; freeze_at_exit()"


def _kernel_exit_s(freeze: bool) -> float:
    from jupyter_client.manager import start_new_kernel

    km, kc = start_new_kernel(kernel_name="python3", startup_timeout=120)
    try:
        reply = kc.execute_interactive(OPEN + ("; " + FREEZE if freeze else ""), timeout=120, silent=True)
        if reply["content"]["status"] != "ok":
            raise RuntimeError(f"the kernel could not open the store: {reply['content']}")
        kc.stop_channels()
        t0 = time.perf_counter()
        km.shutdown_kernel(now=False)  # graceful, as papermill's client does
        return time.perf_counter() - t0
    finally:
        if km.has_kernel:
            km.shutdown_kernel(now=True)


def _process_s(freeze: bool) -> float:
    t0 = time.perf_counter()
    subprocess.run([sys.executable, "-c", (FREEZE + "; " if freeze else "") + OPEN], check=True, timeout=300)
    return time.perf_counter() - t0


def _pairs(measure, reps: int) -> tuple[pd.DataFrame, dict]:
    rows, seen = [], {"with": [], "without": []}
    for i in range(reps):
        got = {}
        for freeze in ((True, False) if i % 2 else (False, True)):  # alternate which arm goes first
            got[freeze] = measure(freeze)
        seen["with"].append(got[True])
        seen["without"].append(got[False])
        rows.append({"prompt": f"pair-{i}", "round": 1, "ratio": got[True] / got[False]})
    return pd.DataFrame(rows), {k: round(statistics.median(v), 3) for k, v in seen.items()}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--reps", type=int, default=8, help="pairs per measurement (default 8)")
    args = p.parse_args(argv)
    if args.reps < 2:
        p.error(f"--reps {args.reps}: use 2 or more (an interval needs two pairs)")
    with tempfile.TemporaryDirectory(prefix="labkit-bench-exit-") as d:
        os.environ["MLFLOW_TRACKING_URI"] = f"sqlite:///{Path(d) / 'mlflow.db'}"
        subprocess.run([sys.executable, "-c", OPEN], check=True, timeout=300)  # the store's schema, once
        out = {"benchmark": "exit", "host": platform.node(), "python": platform.python_version(), "reps": args.reps}
        for name, measure in (("kernel_shutdown", _kernel_exit_s), ("process", _process_s)):
            pairs, medians = _pairs(measure, args.reps)
            est = decide.estimate(pairs, margin=0.02, confidence=0.95)
            out[name] = {"median_s_without": medians["without"], "median_s_with": medians["with"],
                         "ratio": round(est.ratio, 3), "ci95": [round(est.lo, 3), round(est.hi, 3)],
                         "text": est.ci_text()}
            print(f"{name}: {medians['without']:.2f} s without, {medians['with']:.2f} s with freeze_at_exit: "
                  f"{est.ci_text()}", file=sys.stderr)
    print(json.dumps(out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
