"""``labkit export LAB:… --format csv|md|latex``: a logged table, a results-matrix section or
a worksheet as a file a chapter can include.

IDs: a notebook table (LAB:02-3fa2c1-k7q2m/sweep-cells), a matrix section
("LAB:RESULTS-MATRIX §E", §A prefill, §B concurrency), a worksheet ("LAB:WORKSHEET §field",
§accounting). CSV keeps the numeric columns as logged; md and latex are the display form
with the ID in the caption. Output goes to stdout (the file's text, as it is) or --out FILE
(then one line saying what was written); --json prints what was exported, as an object.
A figure ID is refused: `labkit regen` redraws figures (PNG, SVG, PDF).

latex is what a chapter includes as it is: booktabs rules, numbers rounded for print,
columns that wrap to the line width, a ratio beside its interval where the table has one;
§E in the chapter's shape (model/spill, drafter, baseline, one column per n_max, each cell
"tok/s (×) @ first-token %", the load-log text in a note). Its first line names the
packages it needs: booktabs, array and longtable (lscape for a very wide table).
"""

from __future__ import annotations

import argparse
from pathlib import Path

from labkit.commands import add_json_flag, output
from labkit.errors import LabkitError
from labkit.report.export import FORMATS


def setup_arg_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="labkit export", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("id", help='LAB:<run>/<table>, "LAB:RESULTS-MATRIX §E" or "LAB:WORKSHEET §field"')
    p.add_argument("--format", choices=FORMATS, default="csv")
    p.add_argument("--out", default=None, help="write here instead of stdout")
    p.add_argument("--recipe", default=None, help="for worksheets: experiments/<name>.yaml or a path (default: default)")
    p.add_argument("--owner", default=None, help="for worksheets: who owns the keep/reject decision")
    return add_json_flag(p)


def main(argv=None) -> int:
    args = setup_arg_parser().parse_args(argv)
    from labkit.config.recipe import load, resolve
    from labkit.provenance import tracking
    from labkit.report import export

    recipe = resolve(load(args.recipe)) if args.recipe else None
    table = export.resolve(tracking.client(), args.id, recipe=recipe, owner=args.owner)
    text = export.render(table, args.format)
    out = {"id": table["id"], "format": args.format, "rows": len(table["data"]),
           "columns": [str(c) for c in table["data"].columns], "sources": table.get("sources")}
    if args.out:
        path = Path(args.out)
        if not path.parent.is_dir():
            raise LabkitError(f"--out {path}: the folder {path.parent} does not exist", "create it or pick another path")
        path.write_text(text)
        out["out"] = str(path)
        output(args, [f"wrote {path}: [{table['id']}] as {args.format}, {len(table['data'])} rows"], out)
    else:  # the file's text is the answer; with --json it travels inside the object
        output(args, text.rstrip("\n").split("\n"), {**out, "text": text})
    return 0
