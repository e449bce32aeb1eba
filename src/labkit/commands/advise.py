"""``labkit advise``: the recommended k per workload (and "disable" where nothing wins),
looked up from the newest logged k sweep of the recipe: the default becomes a lookup,
not an opinion.

--write puts the stepwise protocol's winner into the recipe file (n_max, n_max_drafter)
with the LAB ID of the evidence in a comment beside it, so the next reproduction runs the
tool-suite control at it; it refuses stale evidence (the recipe's sweep fields changed
since the sweep) and read-only files, and changes no other line."""

from __future__ import annotations

import argparse

from labkit.commands import emit
from labkit.config.recipe import load, resolve
from labkit.provenance import tracking
from labkit.report.advise import advise, write_winner


def setup_arg_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="labkit advise", description=__doc__)
    p.add_argument("--recipe", default=None, help="experiments/<name>.yaml or a path (default: default)")
    p.add_argument("--workload", default=None, help="one workload (default: all measured)")
    p.add_argument("--temperature", type=float, default=0.0, help="sweep temperature to advise for (default 0)")
    p.add_argument("--write", action="store_true",
                   help="write the protocol's winner into the recipe file (n_max, n_max_drafter + LAB ID comment)")
    return p


def main(argv=None) -> int:
    args = setup_arg_parser().parse_args(argv)
    recipe = resolve(load(args.recipe))
    if args.write:
        res = write_winner(tracking.client(), recipe)
        print(f"{res['written']}: n_max = {res['n_max']}, n_max_drafter = {res['n_max_drafter']} [{res['source']}]")
        for w, v in (res.get("workload_settings") or {}).items():
            print(f"  workload_settings.{w} = {v}")
        emit(res)
        return 0
    res = advise(tracking.client(), recipe, workload=args.workload, temperature=args.temperature)
    if res.get("by") == "search":  # per workload: the decision, its held-out check, the flags
        for r in res["per_workload"]:
            print(f"{r['line']} [{res['source']}]")
            if r.get("llama_server"):
                print(f"  llama-server: {r['llama_server']}")
        for extra in (res.get("mix"), res.get("ladder")):
            if extra:
                print(extra)
        emit(res)
        return 0
    for r in res["per_workload"]:
        print(f"{r['workload']:<10} {r['recommend']:<12} (best tested: {r['best_tested']}, "
              f"{r['best_tested_speedup']:.2f}× vs plain) [{res['source']}]")
    for g in res["global_default"] or []:
        print(f"global default for {g['drafter']}: k={g['k']} (geometric-mean speedup {g['geomean_speedup']:.2f}×)")
    if res.get("policy"):
        print(f"k: auto (priced per step): {res['policy']['line']}")
        if res["policy"].get("llama_server_flags"):
            print(f"llama-server (cannot take the policy): {res['policy']['llama_server_flags']}")
    emit(res)
    return 0
