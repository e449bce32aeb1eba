"""The results matrix, in the chapter's sections, from logged runs only.

§A prefill: prefill tok/s and time to first token, apart from decode (the sweep's runs
    carry ``prompt_tokens`` and ``ttft_ms``).
§B concurrency: 07_concurrency's table where that notebook has run.
§E the n_max matrix: per recipe and drafter, for each n_max, decode tok/s, speedup and
    first-token acceptance (``accept_by_pos[0]``, the chapter's denominator) beside
    acceptance per drafted token.

A section is a tidy table of numeric columns (what is logged, exported to CSV and
compared by ``regen``); ``display`` turns it into the chapter's text cells,
"tok/s (×) @ first-token acceptance%", for markdown, LaTeX and notebooks only.
Every row carries the host it was measured on and the ``[LAB: …]`` ID behind it.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import pandas as pd

from labkit.analysis import decide
from labkit.errors import LabkitError
from labkit.provenance.ids import DOCUMENTS
from labkit.report import evidence, printed
from labkit.report.queries import latest_per_recipe

SECTIONS = DOCUMENTS["RESULTS-MATRIX"]
E_LEGEND = ("each n_max cell: decode tok/s (speedup × vs plain) @ first-token acceptance % "
            "[acceptance per drafted token %]; n_max=0 is plain decoding")


@dataclass
class Section:
    """One section's numeric table, the runs behind it, or why it is empty."""

    name: str
    data: pd.DataFrame
    sources: list[dict] = field(default_factory=list)
    no_data: str | None = None

    @property
    def title(self) -> str:
        return SECTIONS[self.name]


def _run_meta(run) -> dict:
    t = run.data.tags
    return {"recipe": t.get("recipe"), "host": evidence.host_label(t), "model": t.get("model.name"),
            "model_sha256": (t.get("model.sha256") or "")[:12], "box": _busy(t), "source": t.get("lab.id")}


def _busy(tags: dict) -> str:
    """How busy the box was while the run measured (its ``machine.*`` tags, see
    provenance.machine_state): a contended sweep must not pass as this machine's speed."""
    if tags.get("machine.busy") is None:
        return "not recorded"
    text = f"{float(tags['machine.busy']):.0%} by others"
    return text + ", CONTENDED" if tags.get("machine.contended") == "true" else text


def _source(run, tables: list[str]) -> dict:
    t = run.data.tags
    return {"id": t.get("lab.id"), "run_id": run.info.run_id, "recipe": t.get("recipe"), "tables": tables}


def _first_token(rows: pd.DataFrame) -> tuple[float | None, float | None]:
    """(first-token acceptance, acceptance per drafted token) pooled over ``rows``."""
    reach = sum(int(r[0]) for r in rows["drafts_reaching_pos"] if r is not None and len(r))
    acc0 = sum(int(r[0]) for r in rows["acc_pos"] if r is not None and len(r))
    drafted, accepted = rows["drafted"].sum(), rows["accepted"].sum()
    return (acc0 / reach if reach else None), (float(accepted / drafted) if drafted else None)


def section_e(c, *, workload: str = "all", temperature: float = 0.0) -> Section:
    """§E: one row per (recipe, drafter, n_max), pooled over workloads (median of cells)."""
    out, sources = [], []
    for run in latest_per_recipe(c, "02_k_sweep"):
        cells, rows = evidence.table_or_none(c, run, "sweep-cells"), evidence.table_or_none(c, run, "sweep-runs")
        if cells is None or rows is None:
            continue
        cells = cells[cells["temperature"] == temperature]
        rows = rows[(rows["temperature"] == temperature) & (~rows["cold"].astype(bool))]
        if workload != "all":
            cells, rows = cells[cells["workload"] == workload], rows[rows["workload"] == workload]
        if cells.empty:
            continue
        meta = _run_meta(run)
        res = evidence.json_tag(run.data.tags, "residency")
        meta["spill"], meta["spill_label"] = evidence.residency_text(res), printed.spill_label(res)
        base = float(cells[cells["k"] == 0]["tok_s"].median()) if (cells["k"] == 0).any() else None
        cells = decide.without_control(cells)
        for (d, k), g in cells.groupby(["drafter", "k"]):
            ft, acc = _first_token(rows[(rows["drafter"] == d) & (rows["k"] == k)]) if k > 0 else (None, None)
            # the pooled decode-only speedup over every workload's pairs, with its CI
            paired = k > 0 and {"decode_tok_s", "prompt", "run"} <= set(rows.columns)  # older runs: no CI
            est = decide.estimate(decide.paired(rows, arm={"drafter": d, "k": int(k)}, value="decode_tok_s",
                                                temperature=None)) if paired else None
            out.append({**meta, "drafter": d, "n_max": int(k), "workloads": int(g["workload"].nunique()),
                        "tok_s": float(g["tok_s"].median()), "tok_s_min": float(g["tok_s_min"].min()),
                        "tok_s_max": float(g["tok_s_max"].max()), "speedup": est.ratio if est and est.ratio else float(g["speedup"].median()),
                        "speedup_min": float(g["speedup_min"].min()), "speedup_max": float(g["speedup_max"].max()),
                        "speedup_lo": est.lo if est else None, "speedup_hi": est.hi if est else None,
                        "verdict": est.verdict if est else None,
                        "speedup_basis": "decode-only (prefill left out), geometric mean over prompts",
                        "first_token_acceptance": ft, "acceptance": acc, "baseline_tok_s": base})
        sources.append(_source(run, ["sweep-cells", "sweep-runs"]))
    return _section("E", pd.DataFrame(out) if out else None, sources,
                    "no finished 02_k_sweep run with sweep tables; run labkit reproduce --only 02_k_sweep")


def section_a(c, *, temperature: float = 0.0) -> Section:
    """§A: per (recipe, workload, drafter): prompt length, TTFT and prefill tok/s (warm runs),
    beside decode tok/s; drafter "none" is plain decoding (a draft model's own prefill
    shows up as a longer TTFT)."""
    out, sources = [], []
    for run in latest_per_recipe(c, "02_k_sweep"):
        rows = evidence.table_or_none(c, run, "sweep-runs")
        if rows is None:
            continue
        rows = rows[(rows["temperature"] == temperature) & (~rows["cold"].astype(bool)) & rows["ttft_ms"].notna()]
        rows = decide.without_control(rows)
        meta = _run_meta(run)
        for (wl, d), g in rows.groupby(["workload", "drafter"]):
            pre = g["prompt_tokens"] / (g["ttft_ms"] / 1e3)
            out.append({**meta, "workload": wl, "drafter": d, "runs": len(g),
                        "prompt_tokens": float(g["prompt_tokens"].median()),
                        "ttft_ms": float(g["ttft_ms"].median()), "ttft_ms_min": float(g["ttft_ms"].min()),
                        "ttft_ms_max": float(g["ttft_ms"].max()), "prefill_tok_s": float(pre.median()),
                        "prefill_tok_s_min": float(pre.min()), "prefill_tok_s_max": float(pre.max()),
                        "decode_tok_s": float(g["decode_tok_s"].median())})
        sources.append(_source(run, ["sweep-runs"]))
    return _section("A", pd.DataFrame(out) if out else None, sources,
                    "no finished 02_k_sweep run with a sweep-runs table; run labkit reproduce --only 02_k_sweep")


def section_b(c) -> Section:
    """§B: 07_concurrency's ``concurrency`` table (with its verdict where logged), per recipe."""
    out, sources = [], []
    for run in latest_per_recipe(c, "07_concurrency"):
        conc = evidence.table_or_none(c, run, "concurrency")
        if conc is None or conc.empty:
            continue
        verdict = evidence.table_or_none(c, run, "concurrency-verdict")
        conc = with_verdict(conc, verdict)
        meta = _run_meta(run)
        out.append(conc.assign(**meta))
        sources.append(_source(run, ["concurrency"] + (["concurrency-verdict"] if verdict is not None else [])))
    return _section("B", pd.concat(out, ignore_index=True) if out else None, sources,
                    "no finished 07_concurrency run with a concurrency table; the re-bench at your concurrency "
                    "is mandatory: run labkit reproduce --only 07_concurrency")


def with_verdict(conc: pd.DataFrame, verdict: pd.DataFrame | None) -> pd.DataFrame:
    """07's concurrency rows with the verdict beside the arm it was reached on: same c and k,
    and the same engine where the verdict names one (labkit's verdict is not llama-server's)."""
    if verdict is None or verdict.empty or not {"c", "k", "verdict"} <= set(verdict.columns):
        return conc
    keys = ["c", "k"] + (["engine"] if "engine" in verdict.columns and "engine" in conc.columns else [])
    return conc.merge(verdict[[*keys, "verdict"]], on=keys, how="left")


def _section(name: str, df: pd.DataFrame | None, sources: list, missing: str) -> Section:
    """The section from its rows (the ``source`` column last), or "no data: ``missing``"."""
    if df is None:
        return Section(name, pd.DataFrame(), sources, evidence.no_data(missing))
    return Section(name, df[[x for x in df.columns if x != "source"] + ["source"]], sources)


BUILDERS = {"A": section_a, "B": section_b, "E": section_e}


def section(c, name: str, **kw) -> Section:
    """Build section ``name`` ("A", "B" or "E") from the newest logged runs."""
    if name not in BUILDERS:
        raise LabkitError(f"the results matrix has no section §{name}",
                          "its sections are " + ", ".join(f"§{s} ({t.split(':')[0]})" for s, t in SECTIONS.items()))
    return BUILDERS[name](c, **kw)


# -- display only -----------------------------------------------------------------------
def _pct(x) -> str:
    return "-" if x is None or pd.isna(x) else f"{x:.0%}"


def display(sec: Section) -> pd.DataFrame:
    """The section as text cells for markdown/LaTeX/notebooks (never logged as data)."""
    df = sec.data
    if df.empty:
        return pd.DataFrame({"no data": [sec.no_data or "no rows"]})
    if sec.name == "E":
        return _display_e(df)
    out = df.copy()
    for col in out.columns:
        if pd.api.types.is_float_dtype(out[col]):
            out[col] = out[col].map(_num)
    return out


def _num(x) -> str:
    if x is None or pd.isna(x):
        return "-"
    return f"{x:.1f}" if abs(x) >= 10 else f"{x:.3g}"


def _display_e(df: pd.DataFrame) -> pd.DataFrame:
    keys = ["recipe", "host", "model", "model_sha256", "spill", "box"]
    rows = []
    for key, g in df.groupby(keys, sort=False, dropna=False):
        base = g[g["n_max"] == 0]
        for d in sorted(x for x in g["drafter"].unique() if x != "none"):
            row = dict(zip(keys, key))
            row["drafter"] = d
            row["n_max=0"] = f"{base['tok_s'].iloc[0]:.1f}" if len(base) else "-"
            for r in g[g["drafter"] == d].sort_values("n_max").itertuples():
                row[f"n_max={r.n_max}"] = (f"{r.tok_s:.1f} ({r.speedup:.2f}×) @ {_pct(r.first_token_acceptance)} "
                                           f"[{_pct(r.acceptance)}]")
            row["source"] = g["source"].iloc[0]
            rows.append(row)
    out = pd.DataFrame(rows)
    ks = sorted((c for c in out.columns if c.startswith("n_max=")), key=lambda c: int(c.split("=")[1]))
    out = out[keys + ["drafter"] + ks + ["source"]]
    # "-" where a cell has no value; a column holding one goes to object first (pandas will no
    # longer upcast a float column for a string fill)
    for col in [c for c in out.columns if out[c].isna().any()]:
        out[col] = out[col].astype(object).fillna("-")
    out.attrs["legend"] = E_LEGEND
    return out


def results_matrix(c, *, workload: str = "all", temperature: float = 0.0) -> pd.DataFrame:
    """§E as the chapter prints it (text cells); a clear error when there is no sweep."""
    sec = section_e(c, workload=workload, temperature=temperature)
    if sec.no_data:
        raise LabkitError("no finished 02_k_sweep runs to build the results matrix from",
                          "run `labkit reproduce --only 02_k_sweep` first")
    return display(sec)

