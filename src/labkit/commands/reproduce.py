"""``labkit reproduce``: run the notebooks with papermill, each one logged as an MLflow run.

Writes executed notebooks and cell journals to a timestamped folder (runs/), prints the
[LAB: ...] IDs produced, compares each run with the previous one of the same recipe, and
exits 1 if any notebook failed (the failed run is marked FAILED, its records kept).

Long measurements keep every arm as it finishes. When the newest run of a notebook with
the same recipe and commit was interrupted (KILLED, FAILED, or RUNNING with its process
gone), it is resumed: only the arms it did not finish are measured. --resume LAB:ID
names the run to continue; --no-resume starts afresh. A resume is refused, naming the
difference, when the recipe's sweep fields, the commit, the model or the engine differ.
"""

from __future__ import annotations

import argparse
import json

from labkit.commands import emit, progress
from labkit.errors import LabkitError
from labkit.provenance.reproduce import reproduce


def setup_arg_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="labkit reproduce", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--recipe", default=None, help="experiments/<name>.yaml or a path (default: default)")
    p.add_argument("--only", action="append", default=None,
                   help="a notebook to run (e.g. 01_cost_fit or 01); repeatable")
    p.add_argument("--out", default=None, help="output folder (default: runs/<timestamp>-<recipe>)")
    p.add_argument("-p", "--param", action="append", default=[], metavar="NAME=JSON",
                   help="a notebook parameter (JSON value), e.g. -p verify_rounds=8; repeatable")
    p.add_argument("--resume", default=None, metavar="LAB:ID",
                   help="continue an interrupted (KILLED/FAILED) run: its notebook and parameters, "
                        "measuring only the arms it did not finish")
    p.add_argument("--no-resume", action="store_true",
                   help="start afresh even when the newest run of the same notebook, recipe and commit "
                        "was interrupted (by default it is resumed)")
    return p


def parse_params(items: list[str]) -> dict:
    out = {}
    for item in items:
        if "=" not in item:
            raise LabkitError(f"parameter {item!r} is not NAME=VALUE", "write e.g. -p verify_rounds=8")
        k, v = item.split("=", 1)
        try:
            out[k] = json.loads(v)
        except json.JSONDecodeError:
            out[k] = v
    return out


def main(argv=None) -> int:
    args = setup_arg_parser().parse_args(argv)
    if args.resume and args.no_resume:
        raise LabkitError("--resume and --no-resume contradict each other", "pass one of them")
    summary = reproduce(recipe=args.recipe, only=args.only, out_dir=args.out, params=parse_params(args.param),
                        progress=progress, resume=args.resume, auto_resume=not args.no_resume)
    for r in summary["results"]:
        progress(f"{r['status']:8s} [{r['id']}] {r['notebook']}")
        arms = r.get("arms") or {}
        if arms.get("planned"):
            progress(f"           arms {arms.get('done')}/{arms['planned']}"
                     + (f", {arms['inherited']} from [{r['resumed_from']}]" if arms.get("inherited") else "")
                     + (f"; drift across the resume: {arms['drift']}" if arms.get("drift") else ""))
        for p in r["produced"]:
            if p["type"] != "cell":
                progress(f"           [{p['id']}] {p['type']}")
        comp = r.get("comparison")
        if comp:
            for m in comp["moved"]:
                progress(f"  MOVED {m['metric']}: {m['previous']:.4g} -> {m['now']:.4g} (band ±{m['band']:.3g}, "
                         f"{m['basis']}) vs [{comp['previous_id']}]")
    emit(summary)
    return 0 if summary["ok"] else 1
