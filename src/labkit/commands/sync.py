"""``labkit sync``: replay local journals into the tracking store.

Every notebook run journals its records locally before MLflow sees them. When the store
was away for part of a run (a team server restarted, a laptop off the network), the run
finished journal-only; `labkit sync` puts into the store ($MLFLOW_TRACKING_URI) what it
does not have yet: params, tags, metrics, cells, tables, figures, the executed notebook,
and the run's final status. Safe to run any number of times: nothing is logged twice.
"""

from __future__ import annotations

import argparse

from labkit.commands import add_json_flag, output, progress
from labkit.provenance.sync import sync


def setup_arg_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="labkit sync", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("paths", nargs="*",
                   help="journals (*.jsonl) or folders holding them (default: the project's runs/ and lab/journal/)")
    p.add_argument("--recheck", action="store_true",
                   help="check journals already synced to this store again (default: skip them)")
    return add_json_flag(p)


def main(argv=None) -> int:
    args = setup_arg_parser().parse_args(argv)
    res = sync(args.paths or None, recheck=args.recheck, progress=progress)
    output(args, [f"{len(res['journals'])} journal(s) checked, {res['written']} record(s) written to "
                  f"{res['tracking_uri']}", *(f"  not in this store: [LAB:{m['run']}] ({m['journal']}); point "
                                              "MLFLOW_TRACKING_URI at its store" for m in res["missing_runs"])], res)
    return 0 if not res["missing_runs"] else 1
