"""``labkit power``: which energy counters this machine has (and why not), and with --k a
power run: decode-window energy (where a counter exists) and CPU time per token for k = 0
vs k, interleaved, median and range over --runs."""

from __future__ import annotations

import argparse

from labkit.commands import emit, progress
from labkit.config import runtime
from labkit.config.recipe import load, resolve
from labkit.decoding import drafters
from labkit.measure import energy, power
from labkit.provenance import fingerprint
from labkit.suites.workloads import load_workload


def setup_arg_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="labkit power", description=__doc__)
    p.add_argument("--recipe", default=None)
    p.add_argument("--k", type=int, default=None, help="speculative k to compare with k = 0 (omit: discovery only)")
    p.add_argument("--drafter", default=None, choices=drafters.names())
    p.add_argument("--workload", default=None, help="default: the recipe's power_workload")
    p.add_argument("--prompts", type=int, default=1, help="prompts of the workload (default 1)")
    p.add_argument("--runs", type=int, default=None)
    p.add_argument("--max-tokens", type=int, default=None)
    return p


def main(argv=None) -> int:
    args = setup_arg_parser().parse_args(argv)
    out = {"counters": power.discover()}
    if args.k is not None:
        r = resolve(load(args.recipe))
        with runtime.open_target(r) as engine:
            drafter = runtime.make_drafter(args.drafter or r.drafters[0], r, engine) if args.k > 0 else None
            prompts = load_workload(args.workload or r.power_workload, limit=args.prompts)
            rows = energy.power_runs(engine, prompts, drafter=drafter, k=args.k, runs=args.runs or r.runs,
                                     max_tokens=args.max_tokens or r.max_tokens, seed=r.seed, progress=progress)
            summ = energy.summary(rows)
            out.update(summary=summ.to_dict("records"), modes=energy.two_modes(summ) if args.k > 0 else None,
                       provenance=fingerprint.collect(recipe=r, engine=engine))
    emit(out)
    return 0
