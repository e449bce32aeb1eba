"""The n_max protocol's decisions, as the chapter writes it: pure functions on sweep rows.

"Step n_max upward only while acceptance stays high and the product suite stays inside
its noise band. Stop at the first step that loses end-to-end."

A step is one draft length k for one drafter, measured against plain decoding on the
same prompts in the same interleaved runs (``measure.sweep.k_sweep`` rows). Its effect is
the geometric-mean end-to-end speedup over (prompt, round) pairs (tokens / time to last
token: prefill, draft-model prefill and every step included, not decode-only) with its CI
and verdict (``analysis.decide``). It passes when all of these hold, and the protocol stops
at the first step that fails any:

- **end-to-end win**: the verdict against ``min_speedup`` (1.0: plain) is "wins" (the CI
  lies above it by more than the margin). "No measurable difference" stops the protocol as
  "no measurable gain": the simpler option (speculation off at this k) is the decision;
- **no loss to the step below**: the CI does not lie wholly below the previous step's
  estimate (stepping up lost end-to-end, even if k still beats plain);
- **acceptance has not collapsed**: accepted / drafted >= ``min_acceptance``;
- **the tool suite stays in its band** at this k (when a suite check ran).

Multiple comparisons: the steps of one drafter are a fixed sequence (k is tested only after
every smaller k passed), which keeps the family-wise error at alpha without correction; the
drafters stepped in parallel are Bonferroni-corrected (``Thresholds.adjust``), and the
sequential looks of each step too (``Thresholds.looks``).

Every failing criterion is recorded in ``stop_reason``, so a reader sees which one
stopped the protocol and by how much. The winner per drafter is its last passing step.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

import numpy as np
import pandas as pd

from labkit.analysis import decide

STEP_COLUMNS = ["drafter", "k", "e2e_speedup", "e2e_lo", "e2e_hi", "verdict", "rounds", "e2e_speedup_min",
                "e2e_speedup_max", "decode_speedup", "acceptance", "first_token_acceptance", "toolsuite_verdict",
                "passed", "stop_reason"]
SPILL_WARNING = ("spilled MoE experts ({label}): stepping past k=1 makes every verify stream k+1 rows through "
                 "host-resident experts; the chapter's rule: never jump to n_max=3 on spilled MoE")


@dataclass(frozen=True)
class Thresholds:
    min_speedup: float = 1.0  # the e2e speedup vs plain a step must beat (by more than the margin)
    min_acceptance: float = 0.4  # accepted / drafted below this is a collapse
    margin: float = decide.DEFAULT_MARGIN
    confidence: float = decide.DEFAULT_CONFIDENCE
    adjust: int = 1  # drafters stepped in parallel (Bonferroni)
    looks: int = 1  # sequential looks per step (Bonferroni spending)
    max_runs: int | None = None  # the rounds a step may reach (futility is judged against it)

    @classmethod
    def from_recipe(cls, recipe, *, adjust: int | None = None) -> Thresholds:
        max_runs = recipe.max_runs or recipe.runs
        return cls(min_speedup=recipe.protocol_min_speedup, min_acceptance=recipe.protocol_min_acceptance,
                   margin=recipe.decision_margin, confidence=recipe.decision_confidence,
                   adjust=adjust if adjust is not None else max(1, len(recipe.drafters)),
                   looks=max_runs - recipe.runs + 1, max_runs=max_runs)

    def decide_kw(self) -> dict:
        return {"margin": self.margin, "confidence": self.confidence, "adjust": self.adjust, "looks": self.looks}


def _pos0(values) -> int:
    return int(values[0]) if values is not None and len(values) else 0


def step_summary(rows: pd.DataFrame, drafter: str, k: int, *, temperature: float = 0.0,
                 th: Thresholds | None = None) -> dict:
    """End-to-end speedup (geometric mean over warm (prompt, run) pairs with the plain run of
    the same prompt and run index, its CI and verdict against ``th.min_speedup``), the pairs'
    range, the decode-only speedup (labelled as such: it leaves out prefill), and acceptance."""
    th = th or Thresholds()
    # the arm's warm rows, only the columns read here (a search judges thousands of times)
    m = ((~rows["cold"]) & (rows["temperature"] == temperature) & (rows["drafter"] == drafter)
         & (rows["k"] == k)).to_numpy()
    spec = rows.loc[m, ["drafted", "accepted", "drafts_reaching_pos", "acc_pos"]]
    if spec.empty:
        raise ValueError(f"no warm rows for {drafter} k={k} at T={temperature}")
    arm = {"drafter": drafter, "k": k}
    pairs = decide.paired(rows, arm=arm, value="e2e_tok_s", temperature=temperature)
    est = decide.estimate(pairs.assign(ratio=pairs["ratio"] / th.min_speedup), **th.decide_kw())
    dec = decide.estimate(decide.paired(rows, arm=arm, value="decode_tok_s", temperature=temperature),
                          **th.decide_kw())
    drafted, reach0 = spec["drafted"].sum(), sum(_pos0(v) for v in spec["drafts_reaching_pos"])
    scale = th.min_speedup
    # where the CI's lower end would be after max_runs rounds, if the estimate stayed put
    proj = decide.projected_halfwidth(pairs, rounds=th.max_runs, level=est.level) if th.max_runs and est.ratio else None
    return {
        "drafter": drafter, "k": int(k), "temperature": float(temperature), "pairs": len(pairs),
        "prompts": est.n_prompts, "rounds": int(pairs["round"].nunique()) if len(pairs) else 0,
        "e2e_speedup": est.ratio * scale if est.ratio else None,
        "e2e_lo": est.lo * scale if est.lo is not None else None,
        "e2e_hi": est.hi * scale if est.hi is not None else None, "verdict": est.verdict,
        "confidence": est.confidence, "ci_level": est.level,
        "e2e_lo_at_budget": float(est.ratio * np.exp(-proj)) * scale if proj is not None else None,
        "e2e_speedup_min": float(pairs["ratio"].min()), "e2e_speedup_max": float(pairs["ratio"].max()),
        "decode_speedup": dec.ratio, "decode_lo": dec.lo, "decode_hi": dec.hi,
        "acceptance": float(spec["accepted"].sum() / drafted) if drafted else None,
        "first_token_acceptance": float(sum(_pos0(v) for v in spec["acc_pos"]) / reach0) if reach0 else None,
    }


def step_line(step: dict) -> str:
    """``'ngram n_max=1: 0.96× (95% CI 0.93–0.99), loses; acceptance 89%'`` (end-to-end)."""
    if step.get("e2e_speedup") is None or step["e2e_speedup"] != step["e2e_speedup"]:
        return f"{step['drafter']} n_max={step['k']}: not measured"
    if step.get("measured") is False:  # decided by the replay: its prediction, labelled as one
        return (f"{step['drafter']} n_max={step['k']}: {step['e2e_speedup']:.2f}× e2e predicted by the replay "
                f"(over prompts {step['e2e_lo']:.2f}–{step['e2e_hi']:.2f}), {step['verdict']}; not measured")
    conf = step.get("confidence", decide.DEFAULT_CONFIDENCE)
    acc = step.get("acceptance")
    acc_s = f"; acceptance {acc:.0%}" if acc is not None and acc == acc else ""
    return (f"{step['drafter']} n_max={step['k']}: {step['e2e_speedup']:.2f}× e2e ({conf:.0%} CI "
            f"{step['e2e_lo']:.2f}–{step['e2e_hi']:.2f}), {step['verdict']}{acc_s}")


def _budget_text(step: dict, th: Thresholds) -> str:
    """Why an undecided step stopped measuring, and about how many rounds would decide it."""
    if not step.get("budget") or step.get("e2e_lo") is None:
        return ""
    if str(step["budget"]).startswith("futile"):
        return f" ({step['budget']})"
    est = decide.Estimate(ratio=step["e2e_speedup"] / th.min_speedup, lo=step["e2e_lo"] / th.min_speedup,
                          hi=step["e2e_hi"] / th.min_speedup, verdict=step["verdict"], confidence=th.confidence,
                          level=th.confidence, margin=th.margin, n_prompts=step.get("prompts", 0),
                          n_pairs=step.get("pairs", 0))
    more = decide.rounds_to_resolve(est, int(step.get("rounds") or 1))
    need = f"; ~{more} more rounds would resolve ±{th.margin:.0%}" if more else ""
    return f" (at this budget: {step['budget']}{need})"


def aa_row(rows: pd.DataFrame, *, temperature: float, th: Thresholds) -> dict | None:
    """The A/A control's row of the protocol-steps table (plain vs plain over every step's
    rounds); None when the rows carry no A/A arm. ``passed`` is whether it reads "no
    measurable difference" with a narrow enough interval (``decide.aa_problem``): when it
    does not, this box's noise decides the verdicts, and
    the run is flagged unreliable instead of reported as a result."""
    est = decide.aa_control(rows, temperature=temperature, margin=th.margin, confidence=th.confidence)
    if est is None:
        return None
    pairs = decide.paired(rows, arm={"drafter": decide.AA, "k": 0}, temperature=temperature)
    ok = decide.aa_reliable(est)
    return {"drafter": decide.AA, "k": 0, "temperature": float(temperature), "pairs": est.n_pairs,
            "prompts": est.n_prompts, "rounds": int(pairs["round"].nunique()), "e2e_speedup": est.ratio,
            "e2e_lo": est.lo, "e2e_hi": est.hi, "verdict": est.verdict, "confidence": est.confidence,
            "ci_level": est.level, "e2e_speedup_min": float(pairs["ratio"].min()),
            "e2e_speedup_max": float(pairs["ratio"].max()), "decode_speedup": None, "acceptance": None,
            "first_token_acceptance": None, "toolsuite_verdict": "n/a: the A/A control (plain vs plain)",
            "passed": ok, "measured": True,
            "stop_reason": "" if ok else (f"{decide.aa_problem(est)}: box noise; "
                                          "this run's verdicts are unreliable")}


def settled(step: dict, th: Thresholds) -> bool:
    """Whether more rounds could change what the protocol does with this step: no, once its
    verdict is decided; once the CI rules out a win (hi <= min_speedup x (1 + margin)); or
    once even ``max_runs`` rounds would leave the CI's lower end at or below that line with
    the estimate where it is (more rounds shrink only the round-to-round part of the spread,
    not the prompt-to-prompt part). Stopping for futility never inflates the error of a
    "wins"; the step then reads "no measurable gain at this budget"."""
    if step.get("verdict") in (decide.WINS, decide.LOSES):
        return True
    line = th.min_speedup * (1 + th.margin)
    hi, at_budget = step.get("e2e_hi"), step.get("e2e_lo_at_budget")
    return (hi is not None and hi <= line) or (at_budget is not None and at_budget <= line)


def failures(step: dict, *, previous: dict | None, th: Thresholds) -> list[str]:
    """The timing and acceptance criteria this step fails (the suite is judged apart: it is
    only run for steps that pass these, being the dearest check)."""
    out = []
    k, verdict = step["k"], step.get("verdict")
    line = step_line(step)
    vs = "" if th.min_speedup == 1.0 else f" against {th.min_speedup:.2f}×"
    if verdict == decide.LOSES:
        out.append(f"loses end-to-end{vs}: {line}")
    elif verdict != decide.WINS:
        out.append(f"no measurable gain end-to-end{vs}: {line}{_budget_text(step, th)}")
    elif previous is not None and step["e2e_hi"] < previous["e2e_speedup"]:
        out.append(f"stepping up lost end-to-end: k={k}'s CI {step['e2e_lo']:.2f}–{step['e2e_hi']:.2f} lies below "
                   f"k={previous['k']}'s {previous['e2e_speedup']:.2f}×")
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


def unmeasured_step(drafter: str, k: int, reason: str, temperature: float = 0.0, pred: dict | None = None) -> dict:
    """The protocol-steps row of a step decided by the replay: not measured (``measured``
    False, no rounds), its estimate, interval and verdict those of the replay's prediction
    over prompts when ``pred`` (a ``replay.prediction_by_k`` row) carries them (``basis``
    says so), else NaN."""
    nan = float("nan")
    row = {"drafter": drafter, "k": int(k), "temperature": temperature, "pairs": 0, "e2e_speedup": nan,
           "e2e_lo": nan, "e2e_hi": nan, "verdict": "not measured: decided by the replay", "rounds": 0,
           "e2e_speedup_min": nan, "e2e_speedup_max": nan, "decode_speedup": nan, "acceptance": nan,
           "first_token_acceptance": nan, "toolsuite_verdict": "not run: decided by the replay",
           "passed": False, "stop_reason": reason, "measured": False, "basis": "decided by the replay"}
    hi = (pred or {}).get("pred_e2e_hi")
    if pred and pred.get("pred_e2e_lo") and hi is not None and np.isfinite(hi):  # one prompt gives no interval
        row.update({"e2e_speedup": pred["pred_e2e_gm"], "e2e_lo": pred["pred_e2e_lo"], "e2e_hi": pred["pred_e2e_hi"],
                    "verdict": pred["pred_e2e_verdict"], "acceptance": pred.get("pred_acceptance", nan),
                    "prompts": pred.get("prompts"),
                    "basis": "predicted by the replay, not measured: the interval is the prediction's spread "
                             "over prompts (the cost model's own error is not in it)"})
    return row


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
    steps = steps[steps["drafter"] != decide.AA]
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
    w = w[w["k"] > 0] if len(w) else w
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
