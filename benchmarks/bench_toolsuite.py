"""Benchmark: the tool suite's runs block by block vs task by task (each prompt computed once).

Notebook 04 runs the suite several times over the same tasks (greedy off and on, then
sampled runs off and on). Block by block, every run prefills every task's prompt again
(its ~60 task-specific rows after the shared few-shot preamble); task by task
(``qc.run_blocks``) each prompt is computed once and its KV cells and last-row logits
serve every run of that task (``Engine.prompt_reuse``). This times both arms on the
same tasks and checks that every output is the same. Arms alternate by round; medians
and ranges over rounds. Prints JSON as its last line.

    python benchmarks/bench_toolsuite.py [--tasks 12] [--runs 2] [--rounds 1] [--k 1]
"""

from __future__ import annotations

import argparse
import json
import time

from labkit.config import recipe as recipes
from labkit.config import runtime
from labkit.provenance import fingerprint
from labkit.suites import qc, toolsuite


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tasks", type=int, default=12)
    ap.add_argument("--runs", type=int, default=2, help="sampled runs per side (notebook 04: toolsuite_runs)")
    ap.add_argument("--rounds", type=int, default=1)
    ap.add_argument("--k", type=int, default=1)
    ap.add_argument("--recipe", default="default")
    args = ap.parse_args()
    r = recipes.load(args.recipe)
    engine = runtime.open_target(r, drafter_names=["ngram"])
    ngram = runtime.make_drafter("ngram", r, engine)
    tasks = toolsuite.load_tasks()[: args.tasks]
    blocks = [b for _, b in qc.control_plan({"ngram": ngram}, k=args.k, runs=args.runs,
                                            temperature=r.toolsuite_temperature, seed=r.seed)]
    engine.prefill(engine.tokenize(toolsuite.build_prompt(tasks[0])))  # warm: the preamble, once, for both arms
    times: dict[str, list[float]] = {"block_by_block": [], "task_by_task": []}
    outputs: dict[str, list] = {}
    for rnd in range(args.rounds):
        for arm in (("block_by_block", "task_by_task") if rnd % 2 == 0 else ("task_by_task", "block_by_block")):
            t0 = time.perf_counter()
            if arm == "block_by_block":
                res = [qc.run_blocks(engine, tasks, [b])[0] for b in blocks]
            else:
                res = qc.run_blocks(engine, tasks, blocks)
            times[arm].append(time.perf_counter() - t0)
            outputs[arm] = [x["rows"]["output"].tolist() for x in res]

    def med(v):
        v = sorted(v)
        return v[len(v) // 2] if len(v) % 2 else (v[len(v) // 2 - 1] + v[len(v) // 2]) / 2

    out = {"bench": "toolsuite_prompt_reuse", "tasks": len(tasks), "runs_per_task": len(blocks), "rounds": args.rounds,
           "seconds": {a: {"median": med(v), "min": min(v), "max": max(v)} for a, v in times.items()},
           "ratio_task_by_task": med(times["task_by_task"]) / med(times["block_by_block"]),
           "same_outputs": outputs["block_by_block"] == outputs["task_by_task"],
           "host": fingerprint.collect(recipe=r, engine=engine).get("host")}
    engine.close()
    print(json.dumps(out))


if __name__ == "__main__":
    main()
