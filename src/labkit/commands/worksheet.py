"""``labkit worksheet``: the chapter's two worksheets for a recipe, filled from logged runs:
the short field worksheet (7 items) and the accounting table (Baseline / Candidate /
Notes). Every field names the [LAB: …] run behind it or says "no data: <reason>".
Human text goes to stderr (--format md: markdown on stdout); JSON is the last line."""

from __future__ import annotations

import argparse
import sys

import pandas as pd

from labkit.commands import emit
from labkit.config.recipe import load, resolve
from labkit.provenance import tracking
from labkit.report import export, worksheet


def setup_arg_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="labkit worksheet", description=__doc__)
    p.add_argument("--recipe", default=None, help="experiments/<name>.yaml or a path (default: default)")
    p.add_argument("--owner", default=None, help="who owns the keep/reject decision (default: recipe field owner)")
    p.add_argument("--format", choices=["text", "md"], default="text",
                   help="text: human-readable on stderr; md: markdown tables on stdout")
    return p


def _text(title: str, rows: list[dict], cols: list[str]) -> str:
    width = max(len(r[cols[0]]) for r in rows)
    lines = [title, "=" * len(title)]
    for r in rows:
        lines.append(f"{r[cols[0]]:<{width}}  " + " | ".join(f"{c}: {r[c]}" for c in cols[1:] if r.get(c))
                     if len(cols) > 2 else f"{r[cols[0]]:<{width}}  {r[cols[1]]}")
        if r.get("source"):
            lines.append(f"{'':<{width}}  [{r['source']}]")
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    args = setup_arg_parser().parse_args(argv)
    r = resolve(load(args.recipe))
    rows = worksheet.accounting(tracking.client(), r, owner=args.owner)
    short = worksheet.field_sheet(rows)
    if args.format == "md":
        for sid, df in (("field", pd.DataFrame(short)), ("accounting", pd.DataFrame(rows))):
            print(export.render({"id": f"LAB:WORKSHEET §{sid}", "title": f"{sid} worksheet, recipe {r.name}",
                                 "data": df, "display": df}, "md"))
    else:
        print(_text(f"Field worksheet (recipe {r.name})", short, ["item", "value"]), file=sys.stderr)
        print(_text(f"Accounting table (recipe {r.name})", rows, ["item", "baseline", "candidate", "notes"]),
              file=sys.stderr)
    emit({"recipe": r.name, "recipe_hash": r.hash, "field": short, "accounting": rows})
    return 0
