"""``labkit power``: which energy counters this machine has (and why not), and with --k a
power run: decode-window energy (where a counter exists) and CPU time per token for k = 0
vs k, interleaved, median and range over --runs."""

from __future__ import annotations

import argparse

from labkit.commands import add_json_flag, output, progress
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
    return add_json_flag(p)


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
            verdicts = energy.compare(rows, k=args.k, margin=r.decision_margin, confidence=r.decision_confidence)
            out.update(summary=summ.to_dict("records"), modes=energy.two_modes(summ) if args.k > 0 else None,
                       verdicts=verdicts.to_dict("records"), provenance=fingerprint.collect(recipe=r, engine=engine))
    output(args, lambda: lines(out), out)
    return 0


def lines(out: dict) -> list[str]:
    """The verdicts first (per-token cost and decode tok/s over plain, with CIs), then each k's
    medians, then which counters this machine has (and for each missing one, why)."""
    res = []
    if out.get("verdicts") is not None:
        res += [f"{v['line']}; paired by prompt and run" for v in out["verdicts"]]
        if out.get("modes"):
            res.append(out["modes"]["text"])
        for s in out["summary"]:
            cpu, j = s.get("cpu_s_per_token"), s.get("j_per_token")
            res.append(f"  k={s['k']}: {s['decode_tok_s']:.1f} tok/s decode, "
                       + (f"{cpu * 1e3:.1f} ms CPU per token" if cpu is not None else "CPU time not measured")
                       + (f", {j:.3f} J per token" if j is not None else f"; energy {s['energy']}")
                       + f" (medians of {s['runs']} warm runs)")
    have = [n for n, c in out["counters"].items() if c.get("available")]
    res.append(f"counters here: {', '.join(have) or 'none'}")
    for n, c in out["counters"].items():
        if not c.get("available"):
            res.append(f"  {n}: not available: {c.get('reason')}" + (f" (fix: {c['fix']})" if c.get("fix") else ""))
    return res
