"""Tables as text for writing: CSV (numeric, as logged), markdown and LaTeX (display form,
the ``[LAB: …]`` ID in the caption). Formatting only; nothing here reads the store."""

from __future__ import annotations

import pandas as pd

from labkit.errors import LabkitError

FORMATS = ("csv", "md", "latex")


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
