"""``labkit show LAB:…``: what a provenance ID points at. By default a summary: notebook,
status, recipe, host, when, what the run found (its verdict lines and intervals), what it
produced by ID, and how to see more; --json prints the whole record (parameters, every
metric, provenance tags). A document section ("LAB:RESULTS-MATRIX §E", "LAB:WORKSHEET
§field") resolves to the runs and tables that back it."""

from __future__ import annotations

import argparse

from labkit.commands import add_json_flag, output
from labkit.provenance import ids
from labkit.provenance.show import show, summary_lines


def setup_arg_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="labkit show", description=__doc__)
    p.add_argument("id", help='e.g. LAB:01-3fa2c1-k7q2m/cost-fit (brackets optional) or "LAB:RESULTS-MATRIX §E"')
    p.add_argument("--recipe", default=None, help="for a worksheet section: the recipe (default: default)")
    return add_json_flag(p)


def section_lines(d: dict) -> list[str]:
    """A document section: what backs it, and how to print it."""
    if d.get("sections"):
        return [f"[{d['id']}] has sections: " + ", ".join(f"{s} {t}" for s, t in d["sections"].items()),
                d["hint"]]
    src = " ".join(f"[{s['id']}]" for s in d.get("sources") or []) or "none"
    return [f"[{d['id']}] {d['title']}: " + (d["no_data"] if d.get("no_data") else f"{d['rows']} rows"),
            f"from: {src}" if len(src) < 250 else f"from {len(d['sources'])} runs: --json lists them",
            f"logged by notebook 06 as [{d['logged_as']}]" if d.get("logged_as") else "not logged by notebook 06 yet",
            f'see more: labkit export "{d["id"]}" --format md · labkit regen "{d["id"]}" · --json']


def main(argv=None) -> int:
    args = setup_arg_parser().parse_args(argv)
    ref = ids.parse_ref(args.id)
    if isinstance(ref, ids.SectionId):
        from labkit.config.recipe import load, resolve
        from labkit.provenance import tracking
        from labkit.report import sections

        res = sections.show(tracking.client(), ref, recipe=resolve(load(args.recipe)))
        output(args, lambda: section_lines(res), res)
        return 0
    res = show(args.id)
    rows = table_lines(res)
    if rows:  # the same figures in both forms: --json carries the preview the person reads
        res = {**res, "table_preview": rows}

    def lines() -> list[str]:
        out = summary_lines(res)
        return out[:-1] + rows + out[-1:] if rows else out  # "see more" stays last

    output(args, lines, res)
    return 0


def table_lines(res: dict) -> list[str]:
    """For an ID that names a table: its rows (their own sentences where the table has them),
    so that ``show`` answers without a second command; the whole table is ``labkit export``."""
    spec = res.get("artifact") or {}
    if spec.get("type") != "table":
        return []
    from labkit.provenance import frames, tracking
    from labkit.report.tableformat import preview_lines

    # the run and table show() already found: read its rows, not resolve the ID a second time
    data = frames.frame_from_json(tracking.read_artifact(tracking.client(), res["run_id"],
                                                         f"tables/{spec['name']}/data.json"))
    return [f"{len(data)} rows:", *(f"  {ln}" for ln in preview_lines(data))]
