"""Did a metric move between two reproductions of the same notebook and recipe?

A metric moved when the two runs' intervals say so: both recorded one (``name.lo`` ..
``name.hi``: the 95% CI of a speedup, the range of a tok/s over its runs) and the two do
not overlap. Only a metric with no interval in either run falls back to ``rel_tol`` of the
previous value, and its row says so (``basis``). A metric that is a decision (``best/k/…``:
the k chosen by verdicts) moved when it changed at all. The arithmetic is one pure function (``compare_metrics``); finding
the previous run is the store's job (``compare_with_previous``).
"""

from __future__ import annotations

from labkit.provenance.metric_keys import canonical_metrics
from labkit.provenance.runtags import machine_of

REL_TOL = 0.05  # a metric without a recorded range is flagged beyond 5% change
DECISIONS = ("best/k/",)  # metrics that are decisions (a k chosen by verdicts): compared for equality


def compare_metrics(new: dict, old: dict, *, rel_tol: float = REL_TOL) -> tuple[list[dict], list[dict]]:
    """(moved, within-noise) rows for every metric both runs logged (ranges, lab/ and arms. bookkeeping and
    system/ metrics of the machine excluded)."""
    moved, same = [], []
    for name, v1 in new.items():
        if name.endswith((".lo", ".hi")) or name.startswith(("lab.", "lab/", "system/", "arms.")) or name not in old:
            continue
        v0 = old[name]
        lo0, hi0 = old.get(f"{name}.lo", v0), old.get(f"{name}.hi", v0)
        lo1, hi1 = new.get(f"{name}.lo", v1), new.get(f"{name}.hi", v1)
        has = f"{name}.lo" in old or f"{name}.lo" in new
        width = max(hi0 - lo0, hi1 - lo1)
        if name.startswith(DECISIONS):  # a decision, not a measurement: any change is news
            row = {"metric": name, "previous": v0, "now": v1, "band": 0.0, "previous_interval": None,
                   "now_interval": None, "basis": "a decision changed (chosen by selection-corrected verdicts)"}
            (moved if v1 != v0 else same).append(row)
            continue
        if has:
            out = hi1 < lo0 or lo1 > hi0
            basis = "intervals do not overlap" if out else "intervals overlap"
        else:
            out = abs(v1 - v0) > rel_tol * abs(v0)
            basis = f"no interval recorded: {rel_tol:.0%} of previous"
        row = {"metric": name, "previous": v0, "now": v1, "band": max(width, 0.0) if has else rel_tol * abs(v0),
               "previous_interval": [lo0, hi0] if has else None, "now_interval": [lo1, hi1] if has else None,
               "basis": basis}
        (moved if out else same).append(row)
    return moved, same


def compare_with_previous(c, result: dict, *, rel_tol: float = REL_TOL) -> dict | None:
    """Metrics of this run vs the previous finished run of the same notebook and recipe,
    on the same machine (``runtags.machine_of``: host label, engine build and CPU; a Mac run
    is never drift of a Linux run, nor a Zen 2 run of a Zen 3 one)."""
    this = c.get_run(result["run_id"])
    exp = this.info.experiment_id
    prev = c.search_runs(
        [exp],
        filter_string=f"tags.`recipe.effective_hash` = '{result['recipe_hash']}' and attributes.status = 'FINISHED'",
        order_by=["attributes.start_time DESC"], max_results=50,
    )
    prev = [r for r in prev if r.info.run_id != result["run_id"] and r.info.start_time < this.info.start_time
            and machine_of(r.data.tags) == machine_of(this.data.tags)]
    if not prev:
        return None
    p = prev[0]
    # canonical names: a run logged before the section/name keys compares with one after
    moved, same = compare_metrics(canonical_metrics(this.data.metrics), canonical_metrics(p.data.metrics),
                                  rel_tol=rel_tol)
    return {"previous_id": p.data.tags.get("lab.id"), "previous_run_id": p.info.run_id,
            "moved": moved, "within_noise": len(same), "contended": contention(this, p)}


def contention(this, previous) -> str | None:
    """Which of the two runs measured on a busy or noisy box, in words; None when neither
    did. Busy: the ``machine.contended`` tags (other processes took the CPUs). Noisy: the
    run's own A/A control flagged it (``aa.reliable`` false, ``aa.problem`` saying why),
    the measured form of the same question. A move next to either may be the box, not the code."""
    said = []
    for label, run in (("this run", this), ("the previous run", previous)):
        t = run.data.tags
        if t.get("machine.contended") == "true":
            said.append(f"{label} [{t.get('lab.id')}] measured on a busy box (other processes took "
                        f"{float(t.get('machine.busy', 0)):.0%} of the CPUs; {t.get('machine.top_others') or '-'})")
        if t.get("aa.reliable") == "false":
            said.append(f"{label} [{t.get('lab.id')}] is unreliable by its own A/A control "
                        f"({t.get('aa.problem') or t.get('aa.line') or t.get('aa.verdict')}): box noise")
    return "; ".join(said) or None
