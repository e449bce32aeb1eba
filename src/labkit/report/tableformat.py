"""Tables as text for writing: CSV (numeric, as logged), markdown and LaTeX (display form,
the ``[LAB: …]`` ID in the caption). Formatting only; nothing here reads the store.

The LaTeX is what a chapter ``\\input``s as it is: booktabs rules, numbers rounded for
print, every cell escaped, a ratio beside its interval ("0.96× [0.93–0.99]") where the
table carries one. A table that fits the line keeps its natural column widths; a wider one
gets ``p{}`` columns that wrap, sized from their content so that the whole row is the
line width (short numeric columns never wrap; long text columns take the room); a table
taller than a page is a ``longtable``. It needs ``\\usepackage{booktabs,array,longtable}``
(all in texlive-latex-base/-recommended), as the file's first line says.
"""

from __future__ import annotations

import math
import unicodedata
from dataclasses import dataclass

import pandas as pd

from labkit.errors import LabkitError
from labkit.report.printed import Printed, ci_columns, is_ratio, ratio

FORMATS = ("csv", "md", "latex")
PACKAGES = "booktabs,array,longtable"


def render(table: dict, fmt: str) -> str:
    """``table`` (from ``resolve``) as ``fmt`` text."""
    if fmt == "csv":
        return table["data"].to_csv(index=False)
    legend = table["display"].attrs.get("legend") or table.get("legend")
    if fmt == "md":
        return to_markdown(_readable(table["display"]), caption=f"{table['title']} [{table['id']}]", legend=legend)
    if fmt == "latex":
        printed = table.get("printed")
        if printed is None:
            disp = _readable(table["display"])
            printed = Printed(columns=[str(c) for c in disp.columns], rows=disp.values.tolist(),
                              numeric=_numeric(disp), legend=legend)
        return latex(printed, caption=f"{table['title']} [{table['id']}]", label=table["id"])
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
    """Text cells for reading (rounded floats, "-" for missing, an estimate and its
    interval in one cell): display only."""
    out, used = {}, set()
    for col in df.columns:
        if col in used:
            continue
        ci = ci_columns(df.columns, col) if pd.api.types.is_numeric_dtype(df[col]) else None
        if ci:
            used.update(ci)
            out.pop(ci[0], None), out.pop(ci[1], None)
            out[col] = [_estimate(col, v, lo, hi) for v, lo, hi in zip(df[col], df[ci[0]], df[ci[1]])]
        else:
            out[col] = [_cell(v) for v in df[col]]
    return pd.DataFrame(out, columns=[c for c in df.columns if c in out])


def _estimate(col: str, v, lo, hi) -> str:
    if is_ratio(col):
        return ratio(v, lo, hi).replace("—", "-")
    return _cell(v) if pd.isna(lo) or pd.isna(hi) else f"{_cell(v)} [{_cell(lo)}–{_cell(hi)}]"


def _numeric(df: pd.DataFrame) -> list[bool]:
    """Columns whose every cell reads as a number (right-aligned, never wrapped)."""
    def num(s: str) -> bool:
        head = s.split(" ")[0].rstrip("×%")
        try:
            float(head)
            return True
        except ValueError:
            return s in ("-", "—")
    return [bool(len(df)) and all(num(str(v)) for v in df[c]) for c in df.columns]


def markdown_lines(df: pd.DataFrame) -> list[str]:
    """A markdown table's lines: header, separator, one line per row."""
    def row(cells) -> str:
        return "| " + " | ".join(str(x).replace("|", "\\|").replace("\n", " ") for x in cells) + " |"

    return [row(df.columns), "|" + "|".join("---" for _ in df.columns) + "|",
            *(row(r) for r in df.itertuples(index=False, name=None))]


def preview_lines(df: pd.DataFrame, *, rows: int = 12, columns: int = 10, width: int = 36) -> list[str]:
    """A table as a terminal shows it: where its rows carry their own sentence (a ``line``
    column, and a ``check`` beside it), those sentences; else the first ``rows`` rows and
    ``columns`` columns as markdown, each cell cut to ``width`` characters. What is left out
    is counted on the last line."""
    head = df.head(rows)
    if "line" in df.columns:
        out = []
        for r in head.to_dict("records"):
            out.append(str(r["line"]))
            if isinstance(r.get("check"), str) and r["check"]:
                out.append(f"  check: {r['check']}")
    else:  # an estimate and its interval read as one cell (_readable), then the first columns
        disp = _readable(head)
        cut = list(disp.columns[columns:])
        disp = disp.iloc[:, :columns].map(lambda v: v if len(v) <= width else v[:width - 1] + "…")
        out = markdown_lines(disp)
    more = [f"{len(df) - rows} more rows"] if len(df) > rows else []
    if "line" not in df.columns and cut:
        more.append(f"{len(cut)} more columns ({', '.join(map(str, cut[:4]))}{', …' if len(cut) > 4 else ''})")
    return out + ([f"… {' and '.join(more)}"] if more else [])


def caption_line(caption: str, legend: str | None = None) -> str:
    return f"*{caption}*" + (f" — {legend}" if legend else "")


def to_markdown(df: pd.DataFrame, *, caption: str, legend: str | None = None) -> str:
    return "\n".join([*markdown_lines(df), "", caption_line(caption, legend)]) + "\n"


# -- LaTeX ------------------------------------------------------------------------------
_TEX = {"\\": r"\textbackslash{}", "&": r"\&", "%": r"\%", "$": r"\$", "#": r"\#", "_": r"\_", "{": r"\{",
        "}": r"\}", "~": r"\textasciitilde{}", "^": r"\textasciicircum{}", "×": r"$\times$", "§": r"$\S$",
        "–": "--", "—": "---", "·": r"$\cdot$", "…": r"\dots{}", "±": r"$\pm$", "≤": r"$\le$", "≥": r"$\ge$",
        "≈": r"$\approx$", "→": r"$\to$", "<": r"$<$", ">": r"$>$", "|": r"$|$", '"': "''", "µ": r"$\mu$",
        "μ": r"$\mu$", "∞": r"$\infty$", "\n": " ", "\t": " ", "\r": " ", "\u00a0": "~"}
_BREAK = {"/", "_", "="}  # long IDs and paths may break after these in a narrow column
CHUNK = 12  # and a run of more characters without one (a sha256) every CHUNK characters


def tex(text, *, breaks: bool = False) -> str:
    """``text`` escaped for LaTeX (pdflatex, default fonts): specials escaped, the few
    symbols tables use mapped, anything the default fonts cannot set spelled in ASCII.
    ``breaks``: let a narrow column break long IDs, paths and hashes (see ``pieces``)."""
    out, run = [], 0
    for ch in str(text):
        if ch in _TEX:
            out.append(_TEX[ch])
        elif ch.isascii() or "\u00c0" <= ch <= "\u00ff":
            out.append(ch)
        else:
            out.append(unicodedata.normalize("NFKD", ch).encode("ascii", "ignore").decode() or "?")
        run = 0 if ch.isspace() else run + 1
        if breaks and (ch in _BREAK or run >= CHUNK):
            out.append(r"\allowbreak{}")
            run = 0
    return "".join(out)


def pieces(text: str) -> list[str]:
    """The pieces ``tex(text, breaks=True)`` can break ``text`` into: at spaces (not at a
    no-break space), after ``_BREAK`` characters, after CHUNK characters without either."""
    out, cur, run = [], "", 0
    for ch in str(text).replace("\t", " "):
        if ch == " ":
            out.append(cur)
            cur, run = "", 0
            continue
        cur += ch
        run = 0 if ch.isspace() else run + 1
        if ch in _BREAK or run >= CHUNK:
            out.append(cur)
            cur, run = "", 0
    out.append(cur)
    return [p for p in out if p]


# How much fits, measured in em of the table's font (Computer Modern widths): a book's line
# is ~345 pt, 38 em at \small (9 pt) and 43 em at \footnotesize (8 pt); 2 \tabcolsep (4 pt
# each) cost ~0.9 em. A little is kept spare: the widths are estimates.
SIZES = (("small", 38.3), ("footnotesize", 43.1))
GAP = 0.9
LANDSCAPE = 1.55  # a landscape page's line against a portrait one (lscape)
PAGE_LINES = 42  # lines a page holds under a caption: a taller table breaks across pages (longtable)
WIDE = 18.0  # a text column wider than this (em) wraps rather than widen the table
_EM = {**dict.fromkeys("0123456789_/–$", 0.5), **dict.fromkeys(" -", 0.333), **dict.fromkeys(".,:;[]'!|il·", 0.278),
       **dict.fromkeys("()t", 0.389), "f": 0.306, "j": 0.306, "r": 0.392, "m": 0.833, "w": 0.722, "M": 0.917,
       "W": 1.03, "%": 0.833, "@": 0.75, "×": 0.778, "=": 0.778, "—": 1.0, "…": 1.0}


def em(text: str) -> float:
    """The width of ``text`` in em of the table's font, roughly."""
    return sum(_EM.get(ch, 0.72 if ch.isupper() else 0.5) for ch in text)


@dataclass
class Layout:
    size: str  # the font size command
    widths: list[float] | None  # column widths in em; None: natural widths (l/r columns)
    landscape: bool = False


def _lines(cell) -> list[str]:
    return str(cell[0] if isinstance(cell, tuple) else cell).split("\n")


def layout(p: Printed) -> Layout:
    """Natural widths when the table fits the line as it is; otherwise columns that wrap,
    each at least as wide as its longest word (a number never breaks), the room left given
    to the columns with the most text; a smaller font, then a landscape page, when even the
    longest words do not fit."""
    n = len(p.columns)
    cells = [[x for r in p.rows for x in _lines(r[i])] for i in range(n)]
    longest = [max([em(x) + 0.15 for x in col] + [1.0]) for col in cells]
    words = [max([em(w) + 0.15 for x in col for w in pieces(x)] + [1.0]) for col in cells]
    least = [max([em(w) + 0.3 for w in pieces(c)] + [words[i], 1.5]) for i, c in enumerate(p.columns)]
    # numbers keep their lines whole when that leaves the text columns their longest words
    whole = [max(least[i], longest[i]) if p.numeric[i] else least[i] for i in range(n)]
    for landscape in (False, True):
        for size, line in SIZES:
            room = line * (LANDSCAPE if landscape else 1) - GAP * n
            if sum(max(a, em(str(c))) for a, c in zip(longest, p.columns)) <= room:
                return Layout(size, None, landscape)
            if sum(whole) <= room:
                least = whole
            if sum(least) <= room:
                break
        else:
            continue
        break
    want = [max(least[i], min(longest[i], WIDE)) for i in range(n)]
    widths, spare = list(least), room - sum(least)
    free = [i for i in range(n) if want[i] > least[i]]
    if spare > 0 and free:  # the room left goes to the columns that would wrap, by how much they hold
        extra = sum(want[i] - least[i] for i in free)
        for i in free:
            widths[i] += min(spare * (want[i] - least[i]) / extra, want[i] - least[i])
    return Layout(size, widths, landscape)


def _height(p: Printed, widths: list[float] | None) -> int:
    """Lines the table body takes, roughly (wrapped cells counted)."""
    total = 0
    for r in p.rows:
        per = [sum(max(1, math.ceil(em(x) / max(widths[i], 1))) if widths else 1 for x in _lines(c))
               for i, c in enumerate(r)]
        total += max(per or [1])
    return total + 2


def _spec(p: Printed, lay: Layout) -> str:
    if lay.widths is None:
        return "".join("r" if num else "l" for num in p.numeric)
    line = dict(SIZES)[lay.size] * (LANDSCAPE if lay.landscape else 1)
    total = max(sum(lay.widths) + GAP * len(lay.widths), line) * 1.003  # rounding must not overfill the line
    return "".join(
        (r">{\raggedleft\arraybackslash}" if num else r">{\raggedright\arraybackslash}")
        + rf"p{{\dimexpr {(w + GAP) / total:.3f}\linewidth-2\tabcolsep\relax}}"
        for w, num in zip(lay.widths, p.numeric))


def _mark(i: int) -> str:
    return "abcdefghijklmnopqrstuvwxyz"[i % 26] * (1 + i // 26)


def _tex_cell(cell, wrap: bool) -> str:
    text, note = (cell if isinstance(cell, tuple) else (cell, None))
    sep = r"\newline " if wrap else " "
    body = sep.join(tex(x, breaks=wrap) for x in str(text).split("\n"))
    return body + (rf"\textsuperscript{{{_mark(note - 1)}}}" if note else "")


def latex(p: Printed, *, caption: str, label: str) -> str:
    """The table as LaTeX a chapter can ``\\input`` (see the module docstring)."""
    lay = layout(p)
    wrap = lay.widths is not None
    head = " & ".join(tex(c, breaks=wrap) for c in p.columns) + r" \\"
    body = [" & ".join(_tex_cell(c, wrap) for c in r) + r" \\" for r in p.rows]
    short = tex(caption)
    cap = r"\caption[{" + short + "}]{" + short + (". " + tex(p.legend) if p.legend else "") + "}"
    lab = r"\label{" + "".join(ch if ch.isalnum() or ch in ":-" else "-" for ch in label) + "}"
    notes = [r"\par\smallskip{\footnotesize\raggedright"] + [
        rf"\textsuperscript{{{_mark(i)}}}\,{tex(n)}\par" for i, n in enumerate(p.notes)] + ["}"] if p.notes else []
    packages = PACKAGES + (",lscape" if lay.landscape else "")
    first = [rf"% labkit export: needs \usepackage{{{packages}}}"]
    size = [rf"\{lay.size}", r"\setlength{\tabcolsep}{4pt}"]
    if _height(p, lay.widths) > PAGE_LINES:  # taller than a page: a longtable breaks across pages
        n = len(p.columns)
        lines = [r"\begingroup", *size, r"\begin{longtable}{" + _spec(p, lay) + "}", cap + lab + r" \\",
                 r"\toprule", head, r"\midrule", r"\endfirsthead",
                 rf"\multicolumn{{{n}}}{{l}}{{\emph{{(continued)}}}} \\", r"\toprule", head, r"\midrule",
                 r"\endhead", r"\bottomrule", r"\endlastfoot", *body, r"\end{longtable}", *notes, r"\endgroup"]
    else:
        lines = [r"\begin{table}[htbp]", r"\centering", *size, cap, lab, r"\begin{tabular}{" + _spec(p, lay) + "}",
                 r"\toprule", head, r"\midrule", *body, r"\bottomrule", r"\end{tabular}", *notes, r"\end{table}"]
    if lay.landscape:
        lines = [r"\begin{landscape}", *lines, r"\end{landscape}"]
    return "\n".join(first + lines) + "\n"


def to_latex(df: pd.DataFrame, *, caption: str, label: str, legend: str | None = None) -> str:
    """A text frame as a booktabs table (see ``latex``)."""
    disp = df.astype(str)
    return latex(Printed(columns=[str(c) for c in df.columns], rows=disp.values.tolist(), numeric=_numeric(disp),
                         legend=legend), caption=caption, label=label)
