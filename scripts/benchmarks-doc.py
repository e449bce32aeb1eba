#!/usr/bin/env python3
"""docs/benchmarks.md from the runs in the MLflow store: how long each logged reproduction
took, one table per host, each row with its date, commit and the LAB IDs of its notebook
runs (src/labkit/report/timings.py). Only the block between the file's markers is
rewritten; the same store gives the same file.

    .venv/bin/python scripts/benchmarks-doc.py                 # the store of MLFLOW_TRACKING_URI (default ./mlflow.db)
    .venv/bin/python scripts/benchmarks-doc.py --check         # exit 1 when the file is not what the store gives
    MLFLOW_TRACKING_URI=http://host:5005 .venv/bin/python scripts/benchmarks-doc.py   # the team's store
    .venv/bin/python scripts/benchmarks-doc.py --store sqlite:///a/mlflow.db --store sqlite:///b/mlflow.db
                                                               # several stores (e.g. fresh clones), merged
    .venv/bin/python scripts/benchmarks-doc.py --keep --store sqlite:///new/mlflow.db
                                                               # add a new store's reproductions, keeping the
                                                               # file's rows of stores that are gone

Progress on stderr; one JSON document as the last line of stdout; exit 2 on bad input.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from labkit.commands import emit, progress
from labkit.errors import LabkitError
from labkit.paths import project_root
from labkit.provenance import tracking
from labkit.provenance.store import redact
from labkit.report import timings


def setup_arg_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="scripts/benchmarks-doc.py", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", default=None, help="the file to write (default: docs/benchmarks.md in the checkout)")
    p.add_argument("--store", action="append", default=None, metavar="URI",
                   help="a tracking URI to read (repeatable: the reproductions of every store, merged by run id); "
                        "default: MLFLOW_TRACKING_URI, else ./mlflow.db")
    p.add_argument("--keep", action="store_true",
                   help="keep the file's rows whose reproductions are not in the stores read, as they were "
                        "written (a session's store is gone; its rows were generated from it)")
    p.add_argument("--check", action="store_true",
                   help="write nothing; exit 1 when the file differs from what the store gives")
    return p


def main(argv=None) -> int:
    args = setup_arg_parser().parse_args(argv)
    out = Path(args.out) if args.out else project_root() / "docs" / "benchmarks.md"
    stores = args.store or [tracking.tracking_uri()]
    reps: dict[str, dict] = {}
    for s in stores:
        progress(f"reading reproductions from {redact(s)}")
        reps.update({r["run_id"]: r for r in timings.reproductions(tracking.client(uri=s))})
    reps = sorted(reps.values(), key=lambda r: (r["start"], r["run_id"]))
    uri = ", ".join(redact(s) for s in stores)
    keep = timings.sections(timings.block_of(out)) if args.keep and out.exists() else None
    block = timings.render(reps, keep=keep)
    hosts = sorted({r["host"] for r in reps})
    summary = {"out": str(out), "store": uri, "reproductions": len(reps), "hosts": hosts}
    if args.check:
        same = out.exists() and out.read_text() == timings.merged(out, block)
        progress(f"{out}: " + ("up to date" if same else "differs from the store: run scripts/benchmarks-doc.py"))
        emit({**summary, "up_to_date": same})
        return 0 if same else 1
    changed = timings.write(out, block)
    progress(f"{out}: {len(reps)} reproductions on {len(hosts)} hosts, " + ("rewritten" if changed else "unchanged"))
    emit({**summary, "changed": changed})
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except LabkitError as e:
        print(f"benchmarks-doc: error: {e.problem}", file=sys.stderr)
        if e.fix:
            print(f"  fix: {e.fix}", file=sys.stderr)
        sys.exit(2)
