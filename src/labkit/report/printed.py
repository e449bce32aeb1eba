"""Sections in the shape a chapter prints them: short cells, the long context in notes.

The logged section (``matrix.section``) is a tidy numeric table; ``matrix.display`` makes
the text cells notebooks show. A printed page needs less in each cell: §E as the chapter
lays it out (model/spill · baseline · n_max=1 · n_max=2 · …, each cell
"tok/s (×) @ first-token %"), the spill as a short label ("host only, 0/19 layers on GPU")
with the load-log text, host and ``[LAB: …]`` ID in a note under the table. Display only:
nothing here is logged or compared by ``regen``.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import pandas as pd

NOT_MEASURED = "—"


@dataclass
class Printed:
    """A table for print: header, rows of cells, and notes the cells point at.

    A cell is text, or (text, note number) to mark it with that note; a "\\n" in the text
    is a line break inside the cell. ``numeric`` marks right-aligned columns."""

    columns: list[str]
    rows: list[list]
    numeric: list[bool]
    notes: list[str] = field(default_factory=list)
    legend: str | None = None


# -- the spill in a few words ------------------------------------------------------------
def spill_label(res) -> str:
    """Where the weights went, in a few words for a table cell ("host only, 0/19 layers on
    GPU"); the full text (``evidence.residency_text``) belongs in a note or the source table."""
    if not res:
        return "not recorded"
    if isinstance(res, str):
        return res if len(res) <= 40 else "see note"
    if "placed" in res or "label" in res:  # read from llama.cpp's load log
        placed, label = res.get("placed") or {}, str(res.get("label") or "")
        on, total = placed.get("layers_offloaded"), placed.get("layers_total")
        layers = f"{on or 0}/{total} layers on GPU" if total is not None else None
        if label.startswith("Apple unified memory"):
            word = "unified memory"
        elif placed.get("experts_on_host"):
            word = f"experts on host ({placed['experts_on_host']} tensors)"
        elif label.startswith("no accelerator") or (total is not None and not on):
            word = "host only"
        elif res.get("spilled"):
            word = "spilled"
        else:
            word = "on GPU" if total is not None else (label[:40] or "placed")
        return ", ".join(x for x in (word, layers) if x)
    if "layers_on_accelerator" in res or "layers_on_host" in res:  # as asked, not read from the load log
        on, host = int(res.get("layers_on_accelerator", 0)), int(res.get("layers_on_host", 0))
        word = "host only" if on == 0 else ("on GPU" if host == 0 else "spilled")
        return f"{word}, {on}/{on + host} layers on GPU (as asked)"
    note = str(res.get("note") or "")
    return "unified memory" if "unified" in note else ("host only" if "host" in note else (note[:40] or "see note"))


# -- numbers rounded for print -------------------------------------------------------------
def _missing(x) -> bool:
    return x is None or (isinstance(x, float) and pd.isna(x))


def rate(x) -> str:
    """tok/s for print: three figures, never more than one decimal."""
    if _missing(x):
        return NOT_MEASURED
    return f"{x:.0f}" if abs(x) >= 100 else f"{x:.1f}"


def ratio(x, lo=None, hi=None) -> str:
    """``0.96×``, with its interval when the table carries one: ``0.96× [0.93–0.99]``."""
    if _missing(x):
        return NOT_MEASURED
    text = f"{x:.2f}×"
    if not _missing(lo) and not _missing(hi):
        text += f"\u00a0[{_bound(lo)}–{_bound(hi)}]"  # never broken apart
    return text


def _bound(x: float) -> str:
    """An interval's end: 0.93, 12, ∞ (one prompt gives an interval without bounds)."""
    return "∞" if x == float("inf") else (f"{x:.2f}" if abs(x) < 10 else f"{x:.0f}")


def pct(x) -> str:
    return NOT_MEASURED if _missing(x) else f"{x:.0%}"


# -- §E ---------------------------------------------------------------------------------
E_KEYS = ["recipe", "host", "model", "model_sha256", "spill", "box", "source"]


CI_PAIRS = (("lo", "hi"), ("ci_lo", "ci_hi"), ("ci_low", "ci_high"), ("low", "high"))
ESTIMATES = ("ratio", "estimate", "value")


def ci_columns(columns, name: str) -> tuple[str, str] | None:
    """The (low, high) interval columns of ``name`` when the table carries them:
    ``speedup`` → ``speedup_lo``/``speedup_hi`` (or ``_ci_low``/``_ci_high``); ``e2e_ratio``
    → ``e2e_lo``/``e2e_hi`` (``decide.Estimate.to_dict("e2e_")``); ``estimate`` →
    ``ci_low``/``ci_high``."""
    stems = [name + "_"] + [name[:-len(w)] for w in ESTIMATES if name.endswith(w)]
    for stem in stems:
        for lo, hi in CI_PAIRS:
            if stem + lo in columns and stem + hi in columns and name not in (stem + lo, stem + hi):
                return stem + lo, stem + hi
    return None


def is_ratio(name: str) -> bool:
    return any(w in name for w in ("ratio", "speedup"))


def _e_cell(r) -> str:
    cols = ci_columns(r.index, "speedup")
    ci = (r[cols[0]], r[cols[1]]) if cols else ()
    return f"{rate(r['tok_s'])} ({ratio(r['speedup'], *ci)})\n@ {pct(r.get('first_token_acceptance'))}"


def chapter_e(df: pd.DataFrame) -> Printed:
    """§E (``matrix.section(c, "E").data``) as the chapter prints it: a row per model, spill
    and drafter (the model/spill and its baseline said once per group); baseline, then one
    column per measured n_max; host, recipe, the load-log text and the run's ID in a note
    per model/spill group."""
    keys = [k for k in E_KEYS if k in df.columns]
    ks = sorted(int(k) for k in df["n_max"].unique() if int(k) > 0)
    columns = ["model / spill", "drafter", "baseline tok/s", *(f"n_max={k}" for k in ks)]
    rows, notes = [], []
    for key, g in df.groupby(keys, sort=False, dropna=False):
        meta = dict(zip(keys, key))
        notes.append(_e_note(meta))
        base = g[g["n_max"] == 0]["tok_s"]
        label = g["spill_label"].iloc[0] if "spill_label" in g.columns else spill_label(meta.get("spill"))
        first = ((f"{meta.get('model') or 'model not recorded'}\n{label}", len(notes)),
                 rate(base.iloc[0]) if len(base) else NOT_MEASURED)
        for d in sorted(x for x in g["drafter"].unique() if x != "none"):
            by_k = {int(r["n_max"]): r for _, r in g[g["drafter"] == d].iterrows()}
            head = first if first else ("", "")
            rows.append([head[0], d, head[1], *(_e_cell(by_k[k]) if k in by_k else NOT_MEASURED for k in ks)])
            first = None
    basis = df["speedup_basis"].dropna().iloc[0] if "speedup_basis" in df.columns and df["speedup_basis"].notna().any() \
        else None
    ci = " [confidence interval]" if ci_columns(df.columns, "speedup") else ""
    legend = (f"Each n_max cell: decode tok/s (speedup × over plain decoding of the same model{ci}) @ first-token "
              "acceptance (accepted / drafts reaching position 1); " + f"{NOT_MEASURED} not measured. "
              + (f"Speedup: {basis}. " if basis else "") + "Baseline: plain decoding (n_max=0).")
    return Printed(columns=columns, rows=rows, numeric=[False, False] + [True] * (len(columns) - 2), notes=notes,
                   legend=legend)


def _e_note(meta: dict) -> str:
    parts = [f"measured on {meta.get('host') or 'an unrecorded host'}"]
    if meta.get("box"):
        parts[0] += f" (box {meta['box']})"
    if meta.get("recipe"):
        parts.append(f"recipe {meta['recipe']}")
    if meta.get("model_sha256"):
        parts.append(f"model sha256 {meta['model_sha256']}…")
    if meta.get("spill"):
        parts.append(f"weights: {meta['spill']}")
    if meta.get("source"):
        parts.append(f"[{meta['source']}]")
    return "; ".join(parts) + "."
