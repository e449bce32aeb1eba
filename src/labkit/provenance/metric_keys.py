"""Metric names: ``section/name``, so the MLflow UI groups charts by section.

MLflow's run page and compare view put every metric whose key has a ``/`` into a chart
section named by the part before the first ``/`` (``tok_s/ngram.edit.T0`` lands in
``tok_s``); keys without one all fall into a single "Model metrics" heap. Recorded
ranges keep their ``.lo`` / ``.hi`` suffix so they sit beside their metric.

Compatibility: runs logged before this scheme used ``.`` everywhere (``tok_s.ngram.edit.T0``,
``H_ms``, ``toolsuite.greedy.off``, ``lab.cell_duration_s``). Code that reads metrics
from the store (drift, the worksheet) reads them through ``canonical_metrics``, which
renames old keys to new ones, so old and new runs compare with each other.
"""

from __future__ import annotations

# old exact key -> new key (the cost-fit scalars had no section at all)
RENAMED = {
    "H_ms": "verify/H_ms",
    "verify_a_ms": "verify/a_ms",
    "verify_b_ms": "verify/b_ms",
    "verify_r2": "verify/r2",
    "cpu_s_per_token": "power/cpu_s_per_token",
    "j_per_token": "power/j_per_token",
}
# old prefix -> new prefix (the first ``.`` became the section separator)
PREFIXES = ("tok_s.", "speedup.", "rejected_share.", "toolsuite.", "costmodel.", "synthetic.", "lab.")

_RANGE = (".lo", ".hi")

# Sections whose keys hold one value per run, a choice rather than a series (the best k
# per drafter and workload, and its speedup). MLflow draws every metric as a chart, and a
# one-value metric as a one-point line; these are logged as run tags instead, which the run
# page lists as values and the runs table can show as columns (labkit.lab's lab.metric).
SUMMARY_SECTIONS = ("best",)


def is_summary(key: str) -> bool:
    """Whether ``key`` is a one-value-per-run summary, logged as a run tag, not a metric."""
    return key.split("/", 1)[0] in SUMMARY_SECTIONS


def summary_text(value: float) -> str:
    """A summary value as its tag text: ``2`` for a k, ``1.0342`` for a speedup."""
    return f"{float(value):.6g}"


def canonical(key: str) -> str:
    """The current name of a metric key, old or new (``H_ms.lo`` -> ``verify/H_ms.lo``)."""
    if "/" in key:
        return key
    base, suffix = (key[:-3], key[-3:]) if key.endswith(_RANGE) else (key, "")
    if base in RENAMED:
        return RENAMED[base] + suffix
    for p in PREFIXES:
        if base.startswith(p):
            return p[:-1] + "/" + base[len(p):] + suffix
    return key


def canonical_metrics(metrics: dict) -> dict:
    """A run's ``{key: value}`` with every key under its current name (new keys win)."""
    out = {canonical(k): v for k, v in metrics.items() if "/" not in k}
    out.update({k: v for k, v in metrics.items() if "/" in k})
    return out
