"""Tables for writing: any logged table, matrix section or worksheet as CSV, markdown or LaTeX.

CSV carries the numeric columns exactly as logged (what a plotting script should read);
markdown and LaTeX carry the display form (the matrix's "tok/s (×) @ acceptance" cells,
numbers rounded for reading) with the ``[LAB: …]`` ID in the caption, so a chapter can
include the file and cite it. A figure ID is not a table: that is an error that says to
``labkit regen`` it (PNG, SVG and PDF, each stamped with its ID).
"""

from __future__ import annotations

import pandas as pd

from labkit.errors import LabkitError
from labkit.provenance import ids, tracking
from labkit.provenance.tracking import _artifacts, _find_part
from labkit.report.queries import load_table

FORMATS = ("csv", "md", "latex")


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


def render(table: dict, fmt: str) -> str:
    """``table`` (from ``resolve``) as ``fmt`` text."""
    if fmt == "csv":
        return table["data"].to_csv(index=False)
    disp = _readable(table["display"])
    legend = table["display"].attrs.get("legend") or table.get("legend")
    if fmt == "md":
        return to_markdown(disp, caption=f"{table['title']} [{table['id']}]", legend=legend)
    if fmt == "latex":
        return to_latex(disp, caption=f"{table['title']} [{table['id']}]" + (f". {legend}" if legend else ""),
                        label=table["id"])
    raise LabkitError(f"unknown format {fmt!r}", f"use one of {', '.join(FORMATS)}")


def _cell(v) -> str:
    if v is None or (isinstance(v, float) and pd.isna(v)):
        return "-"
    if isinstance(v, bool):
        return str(v)
    if isinstance(v, float):
        return f"{v:.1f}" if abs(v) >= 100 else f"{v:.4g}"
    return str(v)


def _readable(df: pd.DataFrame) -> pd.DataFrame:
    """Text cells for reading (rounded floats, "-" for missing): display only."""
    return pd.DataFrame({col: [_cell(v) for v in df[col]] for col in df.columns}, columns=df.columns)


def to_markdown(df: pd.DataFrame, *, caption: str, legend: str | None = None) -> str:
    def row(cells) -> str:
        return "| " + " | ".join(str(x).replace("|", "\\|").replace("\n", " ") for x in cells) + " |"

    lines = [row(df.columns), "|" + "|".join("---" for _ in df.columns) + "|", *(row(r) for r in df.itertuples(
        index=False, name=None)), "", f"*{caption}*" + (f" — {legend}" if legend else "")]
    return "\n".join(lines) + "\n"


_TEX = {"\\": r"\textbackslash{}", "&": r"\&", "%": r"\%", "$": r"\$", "#": r"\#", "_": r"\_", "{": r"\{",
        "}": r"\}", "~": r"\textasciitilde{}", "^": r"\textasciicircum{}", "×": r"$\times$", "§": r"\S{}"}


def tex(text) -> str:
    return "".join(_TEX.get(ch, ch) for ch in str(text))


def to_latex(df: pd.DataFrame, *, caption: str, label: str) -> str:
    """A booktabs table (``\\usepackage{booktabs}``); every cell escaped."""
    body = [" & ".join(tex(x) for x in r) + r" \\" for r in df.itertuples(index=False, name=None)]
    return "\n".join([
        r"\begin{table}[htbp]", r"\centering", r"\small",
        r"\begin{tabular}{" + "l" * len(df.columns) + "}", r"\toprule",
        " & ".join(tex(x) for x in df.columns) + r" \\", r"\midrule", *body, r"\bottomrule", r"\end{tabular}",
        r"\caption{" + tex(caption) + "}",
        r"\label{" + "".join(ch if ch.isalnum() or ch in ":-" else "-" for ch in label) + "}",
        r"\end{table}"]) + "\n"
