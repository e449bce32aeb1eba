"""``labkit worksheet``: the accounting worksheet for a recipe, filled from logged runs
(engine build, model checksum, spill, n_max, mean accept length, warm tok/s, tool-suite
runs, concurrency, energy, decision). Fields with no run behind them say so."""

from __future__ import annotations

import argparse

from labkit.commands import emit
from labkit.config.recipe import load, resolve
from labkit.provenance import tracking
from labkit.report.worksheet import worksheet


def setup_arg_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="labkit worksheet", description=__doc__)
    p.add_argument("--recipe", default=None, help="experiments/<name>.yaml or a path (default: default)")
    return p


def main(argv=None) -> int:
    args = setup_arg_parser().parse_args(argv)
    r = resolve(load(args.recipe))
    fields = worksheet(tracking.client(), r)
    width = max(len(f["field"]) for f in fields)
    for f in fields:
        src = f" [{f['source']}]" if f["source"] else ""
        print(f"{f['field']:<{width}}  {f['value']}{src}")
    emit({"recipe": r.name, "recipe_hash": r.hash, "worksheet": fields})
    return 0
