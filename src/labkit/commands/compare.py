"""``labkit compare``: two or more hosts, engine builds or commits side by side for one
recipe, from the newest finished run of each, with ratio columns against the first
(the oldest machine's run, or --baseline). In the spirit of llama.cpp's
compare-llama-bench. Every run compared is cited by its [LAB: ...] ID.

  labkit compare --recipe default                       # the k sweep, per host label and build
  labkit compare --notebook 01_cost_fit --by host --format latex
"""

from __future__ import annotations

import argparse

from labkit.commands import add_json_flag, cite, output
from labkit.config.recipe import load
from labkit.provenance import tracking
from labkit.report.compare import DIMENSIONS, FORMATS, compare, paired_ratios, render


def setup_arg_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="labkit compare", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--recipe", default=None, help="experiments/<name>.yaml or a path (default: default)")
    p.add_argument("--notebook", default="02_k_sweep", help="whose runs to compare (default: 02_k_sweep)")
    p.add_argument("--by", default="host,build",
                   help=f"what makes a column, comma-separated from {', '.join(DIMENSIONS)} (default: host,build)")
    p.add_argument("--baseline", default=None, help="the column the ratios are against (default: the oldest)")
    p.add_argument("--format", default="md", choices=FORMATS, help="table format on stdout (default: md)")
    return add_json_flag(p)


def main(argv=None) -> int:
    args = setup_arg_parser().parse_args(argv)
    recipe = load(args.recipe)
    by = [d.strip() for d in args.by.split(",") if d.strip()]
    c = tracking.client()
    table, runs = compare(c, recipe_name=recipe.name, notebook=args.notebook, by=by, baseline=args.baseline)
    ratios = paired_ratios(c, runs, notebook=args.notebook, margin=recipe.decision_margin,
                           confidence=recipe.decision_confidence)
    out = {"recipe": recipe.name, "notebook": args.notebook, "by": by, "runs": runs,
           "rows": table.to_dict("records"), "ratios": ratios}

    def lines():
        yield f"{args.notebook} of recipe {recipe.name}, against {runs[0]['label']}:"
        yield from (f"  {r['line']}" for r in ratios)
        if not ratios:
            yield "  one value per run: the ratios below have no interval (compare a 02_k_sweep for CIs)"
        yield from render(table, args.format).rstrip("\n").splitlines()
        yield "runs: " + "; ".join(f"{r['label']} {cite(r['id'])}" for r in runs)

    output(args, lines, out)
    return 0
