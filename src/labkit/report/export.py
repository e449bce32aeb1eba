"""Tables for writing: any logged table, matrix section or worksheet as CSV, markdown or LaTeX.

CSV carries the numeric columns exactly as logged (what a plotting script should read);
markdown and LaTeX carry the display form (the matrix's "tok/s (×) @ acceptance" cells,
numbers rounded for reading) with the ``[LAB: …]`` ID in the caption, so a chapter can
include the file and cite it. A figure ID is not a table: that is an error that says to
``labkit regen`` it (PNG, SVG and PDF, each stamped with its ID).
"""

from __future__ import annotations

from labkit.errors import LabkitError
from labkit.provenance import ids, tracking
from labkit.provenance.tracking import _artifacts, _find_part
from labkit.report.queries import load_table
from labkit.report.tableformat import FORMATS, render, to_latex, to_markdown  # noqa: F401 (re-exported)


def resolve(c, text: str, *, recipe=None, owner: str | None = None) -> dict:
    """The table an ID names, as {"id", "title", "data", "display", "legend"}."""
    from labkit.report import sections

    ref = ids.parse_ref(text)
    if isinstance(ref, ids.SectionId):
        sections.need_section(ref, "export")
        b = sections.build(c, ref, recipe=recipe, owner=owner)
        if b["no_data"]:
            raise LabkitError(f"{ref}: {b['no_data']}", "run the notebook it names, then export again")
        return b
    run = tracking.find_run(c, ref.run)
    tables = [p.split("/")[-1] for p in _artifacts(c, run.info.run_id, "tables")]
    if not ref.part:
        raise LabkitError(f"{ref} names a whole run, not a table",
                          f"name one of its tables: {', '.join(f'{ref}/{t}' for t in tables) or '(none logged)'}")
    specs = _find_part(c, run, ref.part)
    figs = [s for s in specs if s["type"] == "figure"]
    specs = [s for s in specs if s["type"] == "table"]
    if not specs and figs:
        raise LabkitError(f"{ref} names a figure, not a table",
                          f"redraw it with `labkit regen {figs[0]['id']}` (PNG, SVG and PDF, stamped with its ID); "
                          f"tables of that run: {', '.join(tables) or '(none)'}")
    if not specs:
        raise LabkitError(f"run {ref.run} has no table {ref.part!r}",
                          f"its tables: {', '.join(tables) or '(none logged)'}")
    if len(specs) > 1:
        raise LabkitError(f"{ref} produced {len(specs)} tables", "name one: " + ", ".join(s["id"] for s in specs))
    spec = specs[0]
    data = load_table(c, run, spec["name"])
    return {"id": spec["id"], "title": spec["name"], "data": data, "display": data}
