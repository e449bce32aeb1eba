"""``labkit toolsuite``: score the tool-calling suite with speculation off or on.

--spec off|on runs one configuration --runs times (seeded) and prints the scores;
--spec both runs the full control (greedy off/on with divergences, sampled noise band
and verdict), as notebooks/04_tool_suite_qc does.
"""

from __future__ import annotations

import argparse

from labkit.commands import add_json_flag, output, progress
from labkit.config import runtime
from labkit.config.recipe import load, resolve
from labkit.decoding import drafters
from labkit.errors import LabkitError
from labkit.provenance import fingerprint
from labkit.suites import qc, toolsuite


def setup_arg_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="labkit toolsuite", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--recipe", default=None, help="experiments/<name>.yaml or a path (default: default)")
    p.add_argument("--spec", choices=["on", "off", "both"], default="both")
    p.add_argument("--drafter", default=None, choices=drafters.names(),
                   help="for --spec on (default: the recipe's first drafter)")
    p.add_argument("--k", type=int, default=None, help="draft length (default: recipe toolsuite_k)")
    p.add_argument("--runs", type=int, default=None,
                   help="exactly this many runs (default: the recipe's toolsuite_min_runs, then more while "
                        "undecided, up to toolsuite_runs)")
    p.add_argument("--temperature", type=float, default=None,
                   help="0 = greedy (default for --spec on/off); --spec both uses it for the sampled runs")
    p.add_argument("--tasks", type=int, default=None, help="only the first N tasks (quick checks)")
    p.add_argument("--category", default=None, choices=list(toolsuite.CATEGORIES))
    return add_json_flag(p)


def main(argv=None) -> int:
    args = setup_arg_parser().parse_args(argv)
    r = resolve(load(args.recipe))
    k = r.toolsuite_k if args.k is None else args.k
    runs = r.toolsuite_runs if args.runs is None else args.runs
    if k < 0 or runs < 1:
        raise LabkitError(f"k = {k}, runs = {runs}", "use k >= 0 and runs >= 1")
    tasks = toolsuite.load_tasks()
    if args.category:
        tasks = [t for t in tasks if t.category == args.category]
    if args.tasks:
        tasks = tasks[: args.tasks]
    with runtime.open_target(r) as engine:
        names = [args.drafter] if args.drafter else (r.drafters if args.spec == "both" else r.drafters[:1])
        drafters = {n: runtime.make_drafter(n, r, engine) for n in names} if args.spec != "off" else {}
        if args.spec == "both":
            temp = r.toolsuite_temperature if args.temperature is None else args.temperature
            # --runs N: exactly N sampled runs; else the recipe's, stopping when the answer is known
            res = qc.control(engine, tasks, drafters=drafters, k=k, runs=runs, temperature=temp, seed=r.seed,
                             progress=progress, min_runs=r.toolsuite_min_runs if args.runs is None else None)
            lines = [f"{name} k={k}: {v['verdict']}" for name, v in res["verdicts"].items()]
            lines.append(f"sampled runs at T={temp}: {qc.runs_line(res)}; greedy off {res['greedy_off']['score']:.1%}"
                         f"; {len(res['divergences'])} greedy task(s) differing; --json for every score")
            out = {"verdicts": res["verdicts"], "scores": res["scores"].to_dict("records"),
                   "greedy_divergences": res["divergences"].to_dict("records"), "runs": res["runs"],
                   "looks": res["looks"].to_dict("records"), "stopped": res["stopped"]}
        else:
            temp = args.temperature or 0.0
            name, d = next(iter(drafters.items())) if drafters else ("none", None)
            progress(f"tool suite: spec {args.spec} ({name}), T={temp}, {runs} run(s), task by task")
            blocks = [qc.Block(d, k if d else 0, temp, qc.run_seed(r.seed, temp, i)) for i in range(runs)]
            scores = [res["summary"] for res in qc.run_blocks(engine, tasks, blocks)]
            out = {"spec": args.spec, "drafter": name, "k": k if d else 0, "temperature": temp, "runs": scores}
            lines = [f"spec {args.spec} ({name}{f' k={k}' if d else ''}), T={temp}: score "
                     + ", ".join(f"{s['score']:.1%}" for s in scores) + f" over {len(scores)} run(s)"]
        out.update(tasks=len(tasks), provenance=fingerprint.collect(recipe=r, engine=engine))
    output(args, [*lines, f"  {len(tasks)} task(s); --json for the per-category scores"], out)
    return 0
