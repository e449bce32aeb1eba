"""Benchmark: how right `labkit plan` is on this box (the numbers of `labkit plan --check`).

Probes this host if it has no cached machine profile (or with --probe), then predicts and
measures verify(m), m = 1..8, of the embedded model (the calibration model: in sample) and the
SYNTHETIC dense and MoE cost models at 4 and 8 layers (out of sample), and the default recipe's
n-gram cells k = 1..3 on one greedy prompt each of `edit` and `code` (measured speedup with its
interval beside the predicted one, the planner given the measured acceptance). Also the planner
beside the seeds' published §E cells. Prints JSON as its last line; does not touch the cached
profile's residual (`labkit plan --check` does).

    python benchmarks/bench_plan.py [--rounds 8] [--no-sweep] [--probe]
"""

from __future__ import annotations

import argparse
import json
import time

from labkit.analysis import plan_published
from labkit.artifacts import published
from labkit.engines.llamacpp import build_info
from labkit.measure import machine, plancheck
from labkit.provenance import fingerprint
from labkit.suites.workloads import load_workload


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=8)
    ap.add_argument("--no-sweep", action="store_true", help="verify(m) only, no k = 1..3 cells")
    ap.add_argument("--probe", action="store_true", help="measure a fresh machine profile first")
    args = ap.parse_args()
    host, build = fingerprint.host_info(), build_info()
    t0 = time.perf_counter()
    prof = (machine.probe(host=host, build=build, rounds=16, progress=print) if args.probe
            else machine.load_or_probe(host=host, build=build, rounds=16, progress=print))
    prompts = None if args.no_sweep else [p for w in plancheck.SWEEP_WORKLOADS for p in load_workload(w, limit=1)]
    res = plancheck.run_check(prof, prompts=prompts, rounds=args.rounds, progress=print)
    for line in plancheck.summary_lines(res):
        print(line)
    data = published.load()
    pub = plan_published.compare(data, published.model_profiles(data))
    print(json.dumps({
        "host": host, "profile": {k: prof.get(k) for k in ("key", "host", "overhead_ms", "device_note", "measured_at")},
        "residual": res["residual"], "verify": res["verify"].to_dict("records"),
        "cells": None if res["cells"] is None else res["cells"].drop(columns=["line"]).to_dict("records"),
        "published": {k: pub[k] for k in ("winners_match", "signs_match", "row_order_match", "median_abs_speedup_error",
                                          "host_row_ns_per_param_all_rows", "without_host_row_term")},
        "published_cells": pub["cells"], "seconds": round(time.perf_counter() - t0, 1), "label": res["label"],
    }, default=str))


if __name__ == "__main__":
    main()
