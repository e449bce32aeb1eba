"""``labkit worksheet``: the chapter's two worksheets for a recipe, filled from logged runs:
the short field worksheet (7 items) and the accounting table (Baseline / Candidate /
Notes). Every field names the [LAB: …] run behind it or says "no data: <reason>".
By default both as text a person reads (one field per line); --format md prints markdown
tables (what a document includes); --json the object."""

from __future__ import annotations

import argparse

import pandas as pd

from labkit.commands import add_json_flag, output
from labkit.config.recipe import load, resolve
from labkit.provenance import tracking
from labkit.report import export, worksheet


def setup_arg_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="labkit worksheet", description=__doc__)
    p.add_argument("--recipe", default=None, help="experiments/<name>.yaml or a path (default: default)")
    p.add_argument("--owner", default=None, help="who owns the keep/reject decision (default: recipe field owner)")
    p.add_argument("--format", choices=["text", "md"], default="text",
                   help="text: one field per line (default); md: markdown tables")
    return add_json_flag(p)


def text_lines(recipe_name: str, short: list[dict], rows: list[dict]) -> list[str]:
    """Both worksheets, one field per line: the seven items (decision last, as the chapter
    orders them), then each accounting row with what is the same for both arms said once."""
    lines = [f"Field worksheet (recipe {recipe_name}) [LAB:WORKSHEET §field]"]
    for f in short:
        parts = str(f["value"]).split(" | ")
        lines.append(f"{f['item']}: {parts[0]}")
        lines += [f"    {x}" for x in parts[1:]]
        if f.get("source"):
            lines.append(f"    [{f['source']}]")
    lines += ["", f"Accounting table (recipe {recipe_name}) [LAB:WORKSHEET §accounting]"]
    for r in rows:
        lines.append(r["item"])
        if r["candidate"] == worksheet.SAME or r["baseline"] == r["candidate"]:
            lines.append(f"    both: {r['baseline']}")
        elif str(r["candidate"]).startswith(worksheet.SAME):  # the baseline's, plus something
            lines += [f"    both: {r['baseline']}", f"    candidate: {str(r['candidate'])[len(worksheet.SAME):].lstrip('; ')}"]
        else:
            lines += [f"    baseline: {r['baseline']}", f"    candidate: {r['candidate']}"]
        if r.get("notes"):
            lines.append(f"    notes: {r['notes']}")
        if r.get("source"):
            lines.append(f"    [{r['source']}]")
    return lines


def main(argv=None) -> int:
    args = setup_arg_parser().parse_args(argv)
    r = resolve(load(args.recipe))
    rows = worksheet.accounting(tracking.client(), r, owner=args.owner)
    short = worksheet.field_sheet(rows)
    obj = {"recipe": r.name, "recipe_hash": r.hash, "field": short, "accounting": rows}
    if args.format == "md":
        def human():
            for sid, df in (("field", pd.DataFrame(short)), ("accounting", pd.DataFrame(rows))):
                yield export.render({"id": f"LAB:WORKSHEET §{sid}", "title": f"{sid} worksheet, recipe {r.name}",
                                     "data": df, "display": df}, "md")
    else:
        def human():
            return text_lines(r.name, short, rows)
    output(args, human, obj)
    return 0
