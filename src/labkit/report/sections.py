"""Document sections a chapter cites, ``[LAB: RESULTS-MATRIX §E]`` or ``[LAB: WORKSHEET §field]``.

A section is not a run: it is built from the newest logged runs (``matrix``,
``worksheet``), so it resolves to the runs and tables behind it. Notebook 06 also logs
each section as a table (``results-matrix-E``, ``worksheet-field``, …); ``show`` names
that logged copy and ``regen`` redraws the section from the runs and says whether it is
identical to it.
"""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from labkit.errors import LabkitError
from labkit.provenance import frames
from labkit.provenance.ids import DOCUMENTS, SectionId, sections_text
from labkit.report import matrix, printed
from labkit.report.queries import latest_runs, load_table


def logged_name(sid: SectionId) -> str:
    """The table name notebook 06 logs a section under."""
    return f"{sid.doc.lower()}-{sid.section}"


def need_section(sid: SectionId, verb: str) -> None:
    if sid.section is None:
        raise LabkitError(f"{sid} names a whole document; {verb} needs one section",
                          f"name one: {', '.join(f'LAB:{sid.doc} §{s}' for s in DOCUMENTS[sid.doc])}")


def build(c, sid: SectionId, *, recipe=None, owner: str | None = None) -> dict:
    """{"data": numeric frame, "display": text frame, "sources", "no_data", …} for one section."""
    need_section(sid, "building it")
    if sid.doc == "RESULTS-MATRIX":
        sec = matrix.section(c, sid.section)
        return {"id": str(sid), "title": sid.title, "data": sec.data, "display": matrix.display(sec),
                "sources": sec.sources, "no_data": sec.no_data,
                "printed": printed.chapter_e(sec.data) if sid.section == "E" and not sec.data.empty else None}
    from labkit.config.recipe import load
    from labkit.report import worksheet

    recipe = recipe or load()
    rows = worksheet.accounting(c, recipe, owner=owner)
    df = pd.DataFrame(worksheet.field_sheet(rows) if sid.section == "field" else rows)
    ids = list(dict.fromkeys(s.strip() for v in df["source"].dropna() for s in str(v).split(",") if s.strip()))
    return {"id": str(sid), "title": sid.title, "data": df, "display": df, "recipe": recipe.name,
            "sources": [{"id": i} for i in ids], "no_data": None}


def newest_logged(c, sid: SectionId, recipe=None):
    """(run, LAB ID of the table) of the newest 06 run that logged this section, or None."""
    name = logged_name(sid)
    runs = latest_runs(c, "06_results_matrix", recipe_name=recipe.name if recipe and sid.doc == "WORKSHEET"
                       else None, limit=20)
    for run in runs:
        try:
            load_table(c, run, name)
        except LabkitError:
            continue
        return run, f"{run.data.tags.get('lab.id')}/{name}"
    return None


def show(c, sid: SectionId, *, recipe=None, owner: str | None = None) -> dict:
    """What a section ID resolves to: the runs and tables behind it, its logged copy, its shape."""
    if sid.section is None:
        return {"id": str(sid), "document": sid.doc, "sections": {f"§{s}": t for s, t in DOCUMENTS[sid.doc].items()},
                "hint": f"cite one section: {sections_text(sid.doc)}"}
    b = build(c, sid, recipe=recipe, owner=owner)
    logged = newest_logged(c, sid, recipe)
    return {"id": b["id"], "title": b["title"], "sources": b["sources"], "no_data": b["no_data"],
            "rows": len(b["data"]), "columns": [str(x) for x in b["data"].columns],
            "logged_as": logged[1] if logged else None, **({"recipe": b["recipe"]} if "recipe" in b else {})}


def regen(c, sid: SectionId, *, out_dir: Path, recipe=None, owner: str | None = None) -> dict:
    """Redraw a section from the logged runs into ``out_dir`` (CSV + markdown) and compare
    it with the newest copy notebook 06 logged (``identical`` is None when there is none)."""
    from labkit.report import tableformat

    need_section(sid, "regen")
    b = build(c, sid, recipe=recipe, owner=owner)
    if b["no_data"]:
        raise LabkitError(f"{sid}: {b['no_data']}", "run the notebook it names, then regen again")
    dest = out_dir / f"{sid.doc}-{sid.section}"
    dest.mkdir(parents=True, exist_ok=True)
    (dest / "table.csv").write_text(tableformat.render(b, "csv"))
    (dest / "table.md").write_text(tableformat.render(b, "md"))
    logged = newest_logged(c, sid, recipe)
    res = {"id": str(sid), "title": b["title"], "sources": b["sources"], "rows": len(b["data"]),
           "files": [str(dest / "table.csv"), str(dest / "table.md")], "compared_with": None, "identical": None}
    if logged:
        old = load_table(c, logged[0], logged_name(sid))
        res["compared_with"] = logged[1]
        res["identical"] = frames.digest(frames.frame_to_json(old)) == frames.digest(frames.frame_to_json(b["data"]))
    return res
