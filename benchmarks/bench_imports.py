"""Benchmark: what a fresh Python process pays in imports before a reproduction does any work.

Every ``labkit reproduce``, every notebook kernel and every Jupyter server is a new process,
and the test suite starts hundreds of them: an import that costs a second there costs
minutes of ``make test`` on a 2-core box. Each module is imported in its own new process
(``python -c "import X"``, wall time, the median of ``--reps``), so nothing is cached in the
interpreter. It also says which jsonschema is installed and whether ``rfc3987_syntax`` is:
jsonschema 4.25+ imports it for the ``format-nongpl`` extra (jupyter-events asks for it),
and its import builds a lark grammar (pyproject.toml pins jsonschema below 4.25 for that).
Prints JSON as its last line.

    python benchmarks/bench_imports.py [--reps 3]
"""

from __future__ import annotations

import argparse
import importlib.metadata as md
import importlib.util
import json
import platform
import statistics
import subprocess
import sys
import time

MODULES = [
    "nbformat",  # every papermill run, nbclient, the Jupyter server
    "papermill",  # labkit reproduce
    "mlflow",  # every process that records
    "labkit.lab",  # a notebook's start cell
    "labkit.provenance.reproduce",
]


def _import_s(module: str) -> float:
    t0 = time.perf_counter()
    subprocess.run([sys.executable, "-c", f"import {module}"], check=True, timeout=300)
    return time.perf_counter() - t0


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--reps", type=int, default=3, help="new processes per module (default 3)")
    args = p.parse_args(argv)
    if args.reps < 1:
        p.error(f"--reps {args.reps}: use 1 or more")
    bare = [_import_s("sys") for _ in range(args.reps)]
    rows = {}
    for m in MODULES:
        s = [_import_s(m) for _ in range(args.reps)]
        rows[m] = {"median_s": round(statistics.median(s), 3), "min_s": round(min(s), 3), "max_s": round(max(s), 3)}
    out = {
        "benchmark": "imports",
        "host": platform.node(),
        "python": platform.python_version(),
        "reps": args.reps,
        "interpreter_start_s": round(statistics.median(bare), 3),
        "jsonschema": md.version("jsonschema"),
        "rfc3987_syntax_installed": importlib.util.find_spec("rfc3987_syntax") is not None,
        "imports": rows,
    }
    print(json.dumps(out))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
