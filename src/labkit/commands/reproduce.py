"""``labkit reproduce``: run the notebooks with papermill, each one logged as an MLflow run.

Writes executed notebooks and cell journals to a timestamped folder (runs/), prints the
[LAB: ...] IDs produced, compares each run with the previous one of the same recipe, and
exits 1 if any notebook failed (the failed run is marked FAILED, its records kept).
While it runs, stderr says each cell as it ends and, when this machine has a finished run
of the same notebook and recipe, what that run took and the time its later cells took.
The terminal ends with the human summary; the whole record (every run, what it produced,
the comparisons) is the output folder's summary.json, printed as the last line of stdout
only with --json.

Runs the notebooks as committed (refuses changed ones unless --allow-dirty), one
reproduction at a time per checkout and store, each cell within the recipe's
cell_timeout_s. Exit status: 0 ok, 1 a notebook failed or timed out, 2 bad input or
refused, 3 (with --fail-on-moved) a metric moved beyond its noise, 130 Ctrl-C,
143 SIGTERM (the running notebook is marked KILLED, what it logged kept).

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
from labkit.provenance.reproduce import Terminated, reproduce


def setup_arg_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="labkit reproduce", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--recipe", default=None, help="experiments/<name>.yaml or a path (default: default)")
    p.add_argument("--only", action="append", default=None,
                   help="a notebook to run (e.g. 01_cost_fit or 01); repeatable")
    p.add_argument("--out", default=None, help="output folder (default: runs/<timestamp>-<recipe>)")
    p.add_argument("-p", "--param", action="append", default=[], metavar="NAME=JSON",
                   help="a notebook parameter (JSON value), e.g. -p verify_rounds=8; repeatable")
    p.add_argument("--allow-dirty", action="store_true",
                   help="run notebooks that differ from the commit (recorded as lab.allow_dirty)")
    p.add_argument("--timeout", type=_seconds, default=None, metavar="SECONDS",
                   help="whole-run limit (default: the recipe's run_timeout_s, none)")
    p.add_argument("--wait", type=_seconds, default=None, metavar="SECONDS",
                   help="queue behind a reproduction already running here for up to SECONDS (default: refuse)")
    p.add_argument("--fail-on-moved", action="store_true",
                   help="exit 3 when a metric moved beyond its noise vs the previous run")
    p.add_argument("--resume", default=None, metavar="LAB:ID",
                   help="continue an interrupted (KILLED/FAILED) run: its notebook and parameters, "
                        "measuring only the arms it did not finish")
    p.add_argument("--no-resume", action="store_true",
                   help="start afresh even when the newest run of the same notebook, recipe and commit "
                        "was interrupted (by default it is resumed)")
    p.add_argument("--json", action="store_true",
                   help="also print the summary (the output folder's summary.json) as the last line of stdout")
    return p


def _seconds(text: str) -> float:
    try:
        v = float(text)
    except ValueError:
        v = -1.0
    if v <= 0:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of seconds > 0 (e.g. 3600)")
    return v


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
    try:
        summary = reproduce(recipe=args.recipe, only=args.only, out_dir=args.out, params=parse_params(args.param),
                            progress=progress, allow_dirty=args.allow_dirty, timeout=args.timeout, wait=args.wait,
                            resume=args.resume, auto_resume=not args.no_resume)
    except Terminated as e:
        progress("labkit reproduce: terminated (SIGTERM): the running notebook was marked KILLED, its kernel "
                 "shut down, what it logged kept" + (f"; the record: {e.summary['output']}/summary.json" if e.summary["output"]
                                                      else ""))
        if args.json:
            emit(e.summary)
        return 143
    _human_summary(summary)
    if args.json:
        emit(summary)
    if not summary["ok"]:
        return 1
    return 3 if args.fail_on_moved and summary["moved"] else 0


def _decisions(results: list[dict]) -> None:
    """The answer the main job exists for, from the k sweep's run: per workload on or off,
    the mix, and where the chapter's ladder disagreed (02's search tags)."""
    sweep = [r for r in results if r["notebook"] == "02_k_sweep" and r["status"] == "FINISHED" and r.get("run_id")]
    if not sweep:
        return
    from labkit.provenance import tracking

    try:
        tags = tracking.client().get_run(sweep[0]["run_id"]).data.tags
        lines = [d["line"] for d in json.loads(tags.get("search.decisions") or "[]")]
    except Exception as e:  # noqa: BLE001 - the store went away: the summary still ends
        progress(f"decision: not read from the store ({type(e).__name__}); labkit advise shows it")
        return
    if not lines:
        return
    progress(f"decision per workload [{sweep[0]['id']}] (labkit advise for the flags, labkit worksheet for the rest):")
    for line in [*lines, tags.get("search.mix"), tags.get("search.ladder")]:
        if line:
            progress(f"  {line}")


def _human_summary(summary: dict) -> None:
    """What a person reads at the end of the terminal: each notebook's status and IDs, what
    moved, and where the whole record is (summary.json)."""
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
            if comp["moved"] and comp.get("contended"):
                progress(f"  note: {comp['contended']}")
    _decisions(summary["results"])
    res = summary["results"]
    done = sum(r["status"] == "FINISHED" for r in res)
    state = "ok" if summary["ok"] else "NOT ok" + (f" ({len(summary['pending_sync'])} journal(s) not yet in the "
                                                   f"store: labkit sync)" if summary.get("pending_sync") else "")
    progress(f"labkit reproduce: {state}: {done}/{len(res)} notebooks finished, {summary['moved']} metric(s) moved; "
             f"recipe {summary['recipe']}; the whole record: {summary['output']}/summary.json")
