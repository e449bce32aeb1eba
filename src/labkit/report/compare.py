"""Hosts, builds and commits side by side for one recipe: what ``labkit compare`` prints.

In the spirit of llama.cpp's ``scripts/compare-llama-bench.py``: one row per measurement,
one column per machine (the newest finished run of each host label / engine build / git
commit), and a ratio column for each machine against the first. Nothing is measured here.

For the k sweep (``02_k_sweep``) a row is (workload, drafter, k) and its value the median
tok/s of its greedy cells; for any other notebook a row is a logged scalar metric (its
recorded ranges and ``lab.*`` bookkeeping left out).

Every ratio of the k sweep also comes with its interval and verdict (``paired_ratios``):
each machine's generations over the baseline's of the same prompt, temperature and round,
through ``analysis.decide``. A logged scalar is one value per run: its ratio has no interval,
and says so.
"""

from __future__ import annotations

import pandas as pd

from labkit.errors import LabkitError
from labkit.provenance.metric_keys import canonical_metrics
from labkit.report.queries import latest_runs, load_table, run_build, run_host

DIMENSIONS = {
    "host": run_host,
    "build": run_build,
    "commit": lambda run: (run.data.tags.get("git.commit") or "")[:7] or None,
}
FORMATS = ("md", "latex", "csv")


def pick_runs(c, notebook: str, recipe_name: str, by: list[str]) -> list[tuple[tuple, object]]:
    """The newest finished run per distinct (by...) key, oldest key first (the baseline)."""
    bad = [d for d in by if d not in DIMENSIONS]
    if bad or not by:
        raise LabkitError(f"--by {','.join(by)}: unknown dimension {', '.join(bad) or '(none)'}",
                          f"use one or more of {', '.join(DIMENSIONS)}, e.g. --by host,build")
    newest: dict[tuple, object] = {}
    for run in latest_runs(c, notebook, recipe_name=recipe_name, host=None):
        newest.setdefault(tuple(DIMENSIONS[d](run) for d in by), run)
    return sorted(newest.items(), key=lambda kv: kv[1].info.start_time)


def _labels(keys: list[tuple], by: list[str]) -> list[str]:
    """Column names: only the dimensions that differ between the runs compared."""
    vary = [i for i in range(len(by)) if len({k[i] for k in keys}) > 1] or [0]
    return [" · ".join(str(k[i]) for i in vary) for k in keys]


def _values(c, notebook: str, run) -> pd.Series:
    if notebook.endswith("02_k_sweep"):
        cells = load_table(c, run, "sweep-cells")
        cells = cells[cells["temperature"] == 0]
        s = cells.groupby(["workload", "drafter", "k"])["tok_s"].median()
        s.index = [f"{w} {d} k={int(k)} tok/s" for w, d, k in s.index]
        return s
    m = canonical_metrics(run.data.metrics)  # runs from before the section/name keys line up too
    return pd.Series({k: v for k, v in sorted(m.items())
                      if not k.endswith((".lo", ".hi")) and not k.startswith(("lab/", "system/"))}, dtype=float)


def compare(c, *, recipe_name: str, notebook: str = "02_k_sweep", by: list[str] | None = None,
            baseline: str | None = None) -> tuple[pd.DataFrame, list[dict]]:
    """(table, the runs compared). The table has one column per machine and ``B/A`` ratio
    columns against the baseline (the oldest machine's newest run, or ``baseline``)."""
    by = by or ["host", "build"]
    picked = pick_runs(c, notebook, recipe_name, by)
    if len(picked) < 2:
        have = ", ".join(_labels([k for k, _ in picked], by)) or "none"
        raise LabkitError(
            f"{notebook} of recipe {recipe_name}: {len(picked)} distinct {'/'.join(by)} with a finished run "
            f"(have: {have}); a comparison needs two or more",
            f"run `labkit reproduce --recipe {recipe_name} --only {notebook}` on another host (LABKIT_HOST_LABEL) "
            "or build into the same store, or compare by another dimension (--by commit)",
        )
    labels = _labels([k for k, _ in picked], by)
    if baseline is not None:
        if baseline not in labels:
            raise LabkitError(f"--baseline {baseline!r} is not one of the runs compared",
                              f"choose one of: {', '.join(labels)}")
        i = labels.index(baseline)
        picked.insert(0, picked.pop(i))
        labels.insert(0, labels.pop(i))
    table = pd.DataFrame({lab: _values(c, notebook, run) for lab, (_, run) in zip(labels, picked)})
    base = labels[0]
    for lab in labels[1:]:
        table[f"{lab}/{base}"] = table[lab] / table[base]
    table.index.name = "measurement"
    runs = [{"label": lab, "id": run.data.tags.get("lab.id"), "run_id": run.info.run_id,
             **{d: v for d, v in zip(by, key)}} for lab, (key, run) in zip(labels, picked)]
    return table.reset_index(), runs


def render(table: pd.DataFrame, fmt: str, *, digits: int = 3) -> str:
    """The table as Markdown, LaTeX (a ``tabular``) or CSV."""
    if fmt == "csv":
        return table.to_csv(index=False)
    if fmt not in FORMATS:
        raise LabkitError(f"--format {fmt!r} is not known", f"use one of {', '.join(FORMATS)}")

    def cell(v) -> str:
        if isinstance(v, float):
            return "-" if pd.isna(v) else f"{v:.{digits}g}"
        return str(v)

    head = [str(c) for c in table.columns]
    rows = [[cell(v) for v in r] for r in table.itertuples(index=False)]
    if fmt == "md":
        lines = ["| " + " | ".join(head) + " |", "|" + "|".join(["---"] + ["--:"] * (len(head) - 1)) + "|"]
        return "\n".join(lines + ["| " + " | ".join(r) + " |" for r in rows]) + "\n"
    esc = str.maketrans({"_": r"\_", "%": r"\%", "&": r"\&", "#": r"\#", "$": r"\$"})
    lines = [r"\begin{tabular}{l" + "r" * (len(head) - 1) + "}", r"\hline",
             " & ".join(h.translate(esc) for h in head) + r" \\", r"\hline"]
    lines += [" & ".join(v.translate(esc) for v in r) + r" \\" for r in rows]
    return "\n".join(lines + [r"\hline", r"\end{tabular}"]) + "\n"


def paired_ratios(c, runs: list[dict], *, notebook: str = "02_k_sweep", margin: float = 0.02,
                  confidence: float = 0.95) -> list[dict]:
    """Each compared run against the first (``runs`` as ``compare`` returns them), per (workload,
    drafter, k) of the k sweep: decode tok/s paired by prompt, temperature and round, its CI
    and verdict. Empty for other notebooks (one value per run: nothing to pair)."""
    from labkit.analysis import decide

    if not notebook.endswith("02_k_sweep") or len(runs) < 2:
        return []
    frames = []
    for r in runs:
        rows = load_table(c, c.get_run(r["run_id"]), "sweep-runs")
        frames.append(rows[rows["temperature"] == 0].assign(_machine=r["label"]))
    allrows = pd.concat(frames, ignore_index=True)
    base = runs[0]["label"]
    out = []
    for r in runs[1:]:
        arms = allrows[allrows["_machine"] == r["label"]].groupby(["workload", "drafter", "k"]).size().index
        for wl, d, k in arms:
            if d == decide.AA:
                continue
            pairs = decide.paired(allrows[allrows["workload"] == wl], arm={"_machine": r["label"], "drafter": d, "k": k},
                                  base={"_machine": base, "drafter": d, "k": k}, value="decode_tok_s")
            est = decide.estimate(pairs, margin=margin, confidence=confidence)
            name = f"{r['label']}/{base} {wl} {d} k={int(k)}"
            out.append({"measurement": f"{wl} {d} k={int(k)} tok/s", "against": base, "machine": r["label"],
                        **est.to_dict(), "unit": "decode-only", "pairs": est.n_pairs,
                        "line": est.line(name) + f"; decode-only, {est.n_pairs} pair{'s' if est.n_pairs != 1 else ''}"})
    return out
