"""``labkit advise``: the recommended k per workload (and "disable" where nothing wins),
looked up from the newest logged k sweep of the recipe: the default becomes a lookup,
not an opinion.

--write puts the stepwise protocol's winner into the recipe file (n_max, n_max_drafter)
with the LAB ID of the evidence in a comment beside it, so the next reproduction runs the
tool-suite control at it; it refuses stale evidence (the recipe's sweep fields changed
since the sweep) and read-only files, and changes no other line."""

from __future__ import annotations

import argparse

from labkit.commands import add_json_flag, output
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
    return add_json_flag(p)


def main(argv=None) -> int:
    args = setup_arg_parser().parse_args(argv)
    recipe = resolve(load(args.recipe))
    if args.write:
        res = write_winner(tracking.client(), recipe)
        written = [f"{res['written']}: n_max = {res['n_max']}, n_max_drafter = {res['n_max_drafter']} "
                   f"[{res['source']}]"]
        written += [f"  workload_settings.{w} = {v}" for w, v in (res.get("workload_settings") or {}).items()]
        output(args, written, res)
        return 0
    res = advise(tracking.client(), recipe, workload=args.workload, temperature=args.temperature)
    output(args, lambda: lines(res), res)
    return 0


def lines(res: dict) -> list[str]:
    """Per workload the recommendation first, then the evidence: the ratio with its CI, verdict,
    unit and number of pairs (``advise``'s own line), and the sweep it comes from. A search's
    sweep: each workload's decision line (on/off, end to end, its held-out check), the
    llama-server flags that implement an "on", the mix and where the chapter's ladder disagreed."""
    if res.get("by") == "search":
        out = []
        for r in res["per_workload"]:
            out.append(f"{r['line']} [{res['source']}]")
            if r.get("llama_server"):
                out.append(f"  llama-server: {r['llama_server']}")
        return out + [x for x in (res.get("mix"), res.get("ladder")) if x]
    out = []
    for r in res["per_workload"]:
        pairs = f"; {r['pairs']} pair{'s' if r['pairs'] != 1 else ''}" if r.get("pairs") else ""
        out.append(f"{r['workload']}: {r['recommend']} — {r['line']}{pairs} [{res['source']}]")
    for g in res["global_default"] or []:
        ci = (f" (pooled CI {g['lo']:.2f}–{g['hi']:.2f}, best of {len(g.get('k_tested') or [])} k), {g['verdict']}"
              if _known(g.get("lo")) and _known(g.get("hi")) and g["hi"] < float("inf")
              else " (no CI)" + (f", {g['verdict']}" if g.get("verdict") else ""))
        out.append(f"global default for {g['drafter']}: k={g['k']} — best k by geometric mean "
                   f"{g['geomean_speedup']:.2f}× decode-only{ci}")
    if res.get("policy"):
        out.append(f"k: auto (priced per step): {res['policy']['line']}")
        if res["policy"].get("llama_server_flags"):
            out.append(f"llama-server (cannot take the policy): {res['policy']['llama_server_flags']}")
    return out or [f"nothing to advise: the sweep [{res['source']}] has no speculative cell at T={res['temperature']}"]


def _known(x) -> bool:
    return x is not None and x == x  # None, or NaN from a table with some rows unjudged
