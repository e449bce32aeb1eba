"""The n_max protocol's decisions, as the chapter writes it: pure functions on sweep rows.

"Step n_max upward only while acceptance stays high and the product suite stays inside
its noise band. Stop at the first step that loses end-to-end."

A step is one draft length k for one drafter, measured against plain decoding on the
same prompts in the same interleaved runs (``measure.sweep.k_sweep`` rows). It passes
when all of these hold, and the protocol stops at the first step that fails any:

- **end-to-end win**: the median over warm (prompt, run) pairs of spec/plain e2e tok/s
  (tokens / time to last token: prefill, draft-model prefill and every step included,
  not decode-only) exceeds ``min_speedup`` (1.0: it must beat plain);
- **no loss to the step below**: that median is not below the previous step's (stepping
  up lost end-to-end, even if k still beats plain);
- **acceptance has not collapsed**: accepted / drafted >= ``min_acceptance``;
- **the tool suite stays in its band** at this k (when a suite check ran).

Every failing criterion is recorded in ``stop_reason``, so a reader sees which one
stopped the protocol and by how much. The winner per drafter is its last passing step.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

import numpy as np
import pandas as pd

STEP_COLUMNS = ["drafter", "k", "e2e_speedup", "e2e_speedup_min", "e2e_speedup_max", "decode_speedup",
                "acceptance", "first_token_acceptance", "toolsuite_verdict", "passed", "stop_reason"]
SPILL_WARNING = ("spilled MoE experts ({label}): stepping past k=1 makes every verify stream k+1 rows through "
                 "host-resident experts; the chapter's rule: never jump to n_max=3 on spilled MoE")


@dataclass(frozen=True)
class Thresholds:
    min_speedup: float = 1.0  # median e2e speedup vs plain a step must exceed
    min_acceptance: float = 0.4  # accepted / drafted below this is a collapse

    @classmethod
    def from_recipe(cls, recipe) -> Thresholds:
        return cls(min_speedup=recipe.protocol_min_speedup, min_acceptance=recipe.protocol_min_acceptance)


def _pos0(values) -> int:
    return int(values[0]) if values is not None and len(values) else 0


def step_summary(rows: pd.DataFrame, drafter: str, k: int, *, temperature: float = 0.0) -> dict:
    """End-to-end and decode speedup (median and range over warm pairs with the plain run of
    the same prompt and run index) and acceptance of one (drafter, k) in ``rows``."""
    warm = rows[(~rows["cold"]) & (rows["temperature"] == temperature)]
    base = warm[warm["k"] == 0].set_index(["prompt", "run"])
    spec = warm[(warm["drafter"] == drafter) & (warm["k"] == k)]
    if spec.empty:
        raise ValueError(f"no warm rows for {drafter} k={k} at T={temperature}")
    e2e = [r.e2e_tok_s / base.loc[(r.prompt, r.run), "e2e_tok_s"] for r in spec.itertuples()]
    dec = [r.decode_tok_s / base.loc[(r.prompt, r.run), "decode_tok_s"] for r in spec.itertuples()]
    drafted, reach0 = spec["drafted"].sum(), sum(_pos0(v) for v in spec["drafts_reaching_pos"])
    return {
        "drafter": drafter, "k": int(k), "temperature": float(temperature), "pairs": len(e2e),
        "e2e_speedup": float(np.median(e2e)), "e2e_speedup_min": float(np.min(e2e)),
        "e2e_speedup_max": float(np.max(e2e)), "decode_speedup": float(np.median(dec)),
        "acceptance": float(spec["accepted"].sum() / drafted) if drafted else None,
        "first_token_acceptance": float(sum(_pos0(v) for v in spec["acc_pos"]) / reach0) if reach0 else None,
    }


def failures(step: dict, *, previous: dict | None, th: Thresholds) -> list[str]:
    """The timing and acceptance criteria this step fails (the suite is judged apart: it is
    only run for steps that pass these, being the dearest check)."""
    out = []
    k, e2e = step["k"], step["e2e_speedup"]
    if not e2e > th.min_speedup:
        out.append(f"loses end-to-end: k={k} e2e {e2e:.2f}x (range {step['e2e_speedup_min']:.2f}-"
                   f"{step['e2e_speedup_max']:.2f}) <= {th.min_speedup:.2f}x vs plain")
    elif previous is not None and e2e < previous["e2e_speedup"]:
        out.append(f"stepping up lost end-to-end: k={k} e2e {e2e:.2f}x < k={previous['k']}'s "
                   f"{previous['e2e_speedup']:.2f}x")
    acc = step["acceptance"]
    if acc is None:
        out.append(f"acceptance collapse: k={k} drafted nothing")
    elif acc < th.min_acceptance:
        out.append(f"acceptance collapse: k={k} acceptance {acc:.0%} < {th.min_acceptance:.0%}")
    return out


def predicted_failure(pred: dict | None, th: Thresholds, *, margin: float) -> str | None:
    """A step the replay already decides, so measuring it would spend time on a known answer:
    its replayed acceptance (exact for a deterministic drafter under greedy decoding) is
    below the floor, or its predicted e2e speedup is more than ``margin`` below the
    threshold (well beyond the cost model's error). None: the step must be measured."""
    if not pred:
        return None
    k, acc, e2e = pred["k"], pred.get("pred_acceptance"), pred.get("pred_e2e_speedup")
    if acc is not None and pred.get("pred_exact") and acc < th.min_acceptance:
        return f"acceptance collapse (replayed, exact): k={k} acceptance {acc:.0%} < {th.min_acceptance:.0%}"
    if e2e is not None and e2e < th.min_speedup * (1 - margin):
        return (f"loses end-to-end (predicted by replay, not measured): k={k} e2e {e2e:.2f}x is more than "
                f"{margin:.0%} below {th.min_speedup:.2f}x")
    return None


def unmeasured_step(drafter: str, k: int, reason: str, temperature: float = 0.0) -> dict:
    """The protocol-steps row of a step decided by the replay (no measured columns)."""
    nan = float("nan")
    return {"drafter": drafter, "k": int(k), "temperature": temperature, "pairs": 0, "e2e_speedup": nan,
            "e2e_speedup_min": nan, "e2e_speedup_max": nan, "decode_speedup": nan, "acceptance": nan,
            "first_token_acceptance": nan, "toolsuite_verdict": "not run: decided by the replay",
            "passed": False, "stop_reason": reason, "measured": False}


def suite_failure(verdict: dict | None) -> str | None:
    """Why a tool-suite verdict stops the protocol (None: within its band, skipped or not run)."""
    if not verdict or verdict.get("skipped") or verdict.get("within_noise", True):
        return None
    return f"tool suite out of band: {verdict['verdict']}"


def suite_text(verdict: dict | None) -> str:
    if verdict is None:
        return "not run: the step already failed"
    if verdict.get("skipped"):
        return f"skipped: {verdict['skipped']}"
    return verdict["verdict"]


def judge(step: dict, *, previous: dict | None, th: Thresholds, suite: dict | None = None,
          last_k: bool = False) -> dict:
    """The step's row of the protocol-steps table: passed, and why it stopped if it did."""
    fails = failures(step, previous=previous, th=th)
    sf = suite_failure(suite)
    if sf:
        fails.append(sf)
    passed = not fails
    reason = "; ".join(fails) if fails else ("reached the largest k in the recipe" if last_k else "")
    return {**step, "toolsuite_verdict": suite_text(suite), "passed": passed, "stop_reason": reason, "measured": True}


def winners(steps: pd.DataFrame) -> pd.DataFrame:
    """Per drafter: its last passing step (k = 0, "disable", when even k=1 failed)."""
    if steps.empty:
        return pd.DataFrame(columns=["drafter", "k", "e2e_speedup", "stopped_at", "stop_reason"])
    rows = []
    for d, g in steps.groupby("drafter", sort=False):
        ok = g[g["passed"]].sort_values("k")
        stop = g[~g["passed"]]
        top = ok.iloc[-1] if len(ok) else None
        rows.append({"drafter": d, "k": int(top["k"]) if top is not None else 0,
                     "e2e_speedup": float(top["e2e_speedup"]) if top is not None else 1.0,
                     "stopped_at": int(stop["k"].min()) if len(stop) else None,
                     "stop_reason": stop.sort_values("k")["stop_reason"].iloc[0] if len(stop)
                     else g.sort_values("k")["stop_reason"].iloc[-1]})
    return pd.DataFrame(rows)


def winner(steps: pd.DataFrame) -> dict:
    """The overall candidate: the drafter whose winning step is fastest end-to-end; k = 0
    (drafter None) when no drafter passed k=1."""
    w = winners(steps)
    w = w[w["k"] > 0]
    if w.empty:
        return {"drafter": None, "k": 0, "e2e_speedup": 1.0}
    top = w.loc[w["e2e_speedup"].idxmax()]
    return {"drafter": top["drafter"], "k": int(top["k"]), "e2e_speedup": float(top["e2e_speedup"])}


def winner_tag(win: dict, *, source: str) -> str:
    """The ``protocol.winner`` run tag: JSON {"drafter", "k", "source"} (source: the LAB ID of
    the protocol-steps table that is the evidence)."""
    return json.dumps({"drafter": win["drafter"], "k": int(win["k"]), "source": source})


def stopped_text(steps: pd.DataFrame) -> str:
    """One line per drafter: where it stopped and why (the ``protocol.stopped`` tag)."""
    parts = []
    for r in winners(steps).itertuples():
        where = f"stopped at k={r.stopped_at}" if r.stopped_at is not None else "never stopped"
        parts.append(f"{r.drafter}: {where} ({r.stop_reason}); winner k={r.k}")
    return " | ".join(parts)


def spill_warning(residency: dict | None, next_k: int) -> str | None:
    """The chapter's guard: a warning before stepping past k=1 on spilled MoE experts."""
    if next_k <= 1 or not residency or not residency.get("spilled_experts"):
        return None
    return SPILL_WARNING.format(label=residency.get("label", "experts on the host"))
