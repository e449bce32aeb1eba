"""The search: which speculative setting to turn on, per workload, decided on evidence.

The chapter's n_max ladder steps k up from 1 and stops at the first rung that does not
win. It was written for GPUs, where verify(m) is nearly flat for small m and k = 1 is the
safe first step. On a CPU where a second verified row costs about one more plain step,
k = 1 is the dearest point per accepted token, and the ladder stops on its worst rung
while the win sits at k = 5. The search looks where the evidence points instead:

1. **Split** each workload's prompts, seeded and before anything is measured, into the
   prompts that choose and the prompts that check (``split``).
2. **Rank** every replayable (drafter, k) per workload by the replay's predicted
   end-to-end speedup on the choosing prompts (exact acceptance under greedy decoding,
   priced with this box's verify(m)), with its spread over prompts (``rank``).
3. **Measure** the top ``search_candidates`` fixed settings of each workload and the
   priced policy (``k: auto``) against plain and the A/A arm, interleaved, on the choosing
   prompts; undecided candidates get more rounds within the budget (``measure.search``).
4. **Decide** per workload (``decide_workload``): the fastest candidate whose verdict is
   "wins", judged at 1 - alpha / (S x looks) for its S measured candidates and its
   sequential looks (Bonferroni, as everywhere in labkit); otherwise off, the simpler option.
5. **Check** each decision on the held-out prompts (``check``): the realised ratio beside
   the decision's interval. An "on" that the fresh prompts contradict (it loses there, is
   not faster there, or their interval lies wholly below the decision's) fails its check
   and falls back to off.
6. **The mix** (``mix``): the whole traffic's speedup, weighted by the recipe's
   ``traffic_mix`` (share of generated tokens per workload; default equal).

Why the check matters beyond reporting: the candidates are ranked on the same prompts they
are then measured on, so a candidate whose prompts happen to suit it is both ranked up and
measured up (the winner's curse over prompts). Bonferroni over the measured candidates
covers the measurement noise, not that; a fresh set of prompts does. The selection as a
whole (ranking, selection, sequential rounds, check) is tested by simulation against known
answers in ``tests/test_search.py``.

Pure: no engine. ``measure.search`` drives the measuring and calls these.
"""

from __future__ import annotations

import zlib
from dataclasses import dataclass

import numpy as np
import pandas as pd

from labkit.analysis import decide
from labkit.analysis import protocol as ladder
from labkit.errors import LabkitError

ON, OFF = "on", "off"


@dataclass(frozen=True)
class Arm:
    """One measured setting: a fixed (drafter, k), or a policy arm ("ngram+priced" at k_max)."""

    drafter: str
    k: int
    policy: bool = False

    @property
    def label(self) -> str:
        if self.policy:
            return f"{self.drafter.split('+')[0]} k auto (≤{self.k})"
        return f"{self.drafter} k={self.k}"


# -- 1. the split --------------------------------------------------------------------------
def split(prompts: list, *, check_share: float, seed: int) -> tuple[list, list]:
    """(choose, check): per workload, a seeded permutation of its prompts, the first
    ``round(n x (1 - check_share))`` choosing and the rest checking. The seed and the
    workload's name fix it before anything is measured (the same recipe, the same split)."""
    by: dict[str, list] = {}
    for p in prompts:
        by.setdefault(p.workload, []).append(p)
    choose, check = [], []
    for w, ps in by.items():
        n = len(ps)
        n_check = int(round(n * check_share))
        if n_check < 1 or n - n_check < 1:
            raise LabkitError(
                f"check_share = {check_share} leaves workload {w!r} ({n} prompt(s)) with "
                f"{'no checking' if n_check < 1 else 'no choosing'} prompts",
                "raise prompts_per_workload (at least 2; 8 or more for a verdict per workload) or set "
                "check_share so that both sides keep a prompt (e.g. 0.4)")
        rng = np.random.default_rng([seed, zlib.crc32(w.encode())])
        order = rng.permutation(n)
        choose += [ps[i] for i in sorted(order[: n - n_check])]
        check += [ps[i] for i in sorted(order[n - n_check:])]
    return choose, check


# -- 2. the ranking ------------------------------------------------------------------------
def rank(pred: pd.DataFrame) -> pd.DataFrame:
    """Per (workload, drafter, k): the replay's predicted end-to-end speedup over the
    choosing prompts (geometric mean, its t interval over prompts: the prediction's spread,
    not the cost model's error), ranked within the workload (rank 1 = best)."""
    cols = ["workload", "drafter", "k", "prompts", "pred_e2e_gm", "pred_e2e_lo", "pred_e2e_hi", "pred_acceptance",
            "pred_tokens_per_step", "rank"]
    if pred is None or pred.empty:
        return pd.DataFrame(columns=cols)
    out = []
    for (w, d, k), g in pred.groupby(["workload", "drafter", "k"]):
        est = decide.estimate(pd.DataFrame({"prompt": g["prompt"].astype(str).to_numpy(), "round": 0,
                                            "ratio": g["pred_e2e_speedup"].astype(float).to_numpy()}))
        drafted = g["pred_drafted"].sum()
        out.append({"workload": w, "drafter": d, "k": int(k), "prompts": len(g), "pred_e2e_gm": est.ratio,
                    "pred_e2e_lo": est.lo, "pred_e2e_hi": est.hi,
                    "pred_acceptance": float(g["pred_accepted"].sum() / drafted) if drafted else None,
                    "pred_tokens_per_step": float(g["pred_tokens_per_step"].mean())})
    t = pd.DataFrame(out).sort_values(["workload", "pred_e2e_gm", "k"], ascending=[True, False, True])
    t["rank"] = t.groupby("workload").cumcount() + 1
    return t[cols].reset_index(drop=True)


def arms_for(ranked: pd.DataFrame, *, n_fixed: int, auto: dict[str, Arm] | None = None) -> dict[str, list[Arm]]:
    """workload -> the arms to measure: its ``n_fixed`` best-ranked fixed settings, then the
    policy arm (``auto``: drafter -> Arm) of the best-ranked setting's drafter, when there is one."""
    if n_fixed < 1:
        raise LabkitError(f"search_candidates = {n_fixed}: the search must measure at least one candidate",
                          "set search_candidates to 1 or more (1: the predicted best fixed k, beside k auto)")
    out = {}
    for w, g in ranked.groupby("workload", sort=True):
        top = g.sort_values("rank").head(n_fixed)
        arms = [Arm(r.drafter, int(r.k)) for r in top.itertuples()]
        pol = (auto or {}).get(top.iloc[0]["drafter"]) if len(top) else None
        out[w] = arms + ([pol] if pol is not None else [])
    return out


# -- 3./4. judging and deciding --------------------------------------------------------------
def thresholds(th: ladder.Thresholds, n_arms: int) -> ladder.Thresholds:
    """A workload's thresholds: alpha shared by its ``n_arms`` measured candidates."""
    return ladder.Thresholds(min_speedup=th.min_speedup, min_acceptance=th.min_acceptance, margin=th.margin,
                             confidence=th.confidence, adjust=max(1, n_arms), looks=th.looks, max_runs=th.max_runs)


def summaries(rows: pd.DataFrame, arms: list[Arm], th: ladder.Thresholds, *, temperature: float = 0.0) -> list[dict]:
    """Each arm's end-to-end estimate against plain on ``rows`` (one workload's), corrected for
    the ``len(arms)`` candidates and the looks (``analysis.protocol.step_summary``)."""
    tw = thresholds(th, len(arms))
    out = []
    for a in arms:
        s = ladder.step_summary(rows, a.drafter, a.k, temperature=temperature, th=tw)
        out.append({**s, "label": a.label, "policy": a.policy})
    return out


def open_arms(summ: list[dict], arms: list[Arm], th: ladder.Thresholds, *, rows: pd.DataFrame | None = None,
              temperature: float = 0.0, fresh_prompts: int = 0) -> list[Arm]:
    """The arms whose verdict more rounds could still change (``analysis.protocol.settled``).

    After one round a prompt's rounds cannot say how much of the spread over prompts is round
    noise, which more rounds shrink, and how much is the prompts themselves, which they do not;
    the A/A arm can: plain over plain varies by round noise alone. With ``rows`` (carrying the
    A/A arm), an arm measured for one round whose interval would still not clear the win line
    at ``max_runs`` rounds, were all its round noise that large, is settled (futile) too.
    ``fresh_prompts``: the rounds left measure that many more prompts (the search's reserve)
    instead of repeating these, which narrows the spread over prompts as well; then an arm is
    futile only where its estimate itself shows no gain beyond the margin. Projecting the
    interval at the estimate (as for repeated rounds) denies the reserve to half the arms
    whose true effect sits at the line: in simulation at the family 26 box's spread a true
    +10% was turned on in 110 of 200 that way, 135 this way, with the same 4 of 200 false
    wins (the reserve is spent in more searches: 125 of 200 with nothing to find, 21 before)."""
    tw = thresholds(th, len(arms))
    noise = round_noise(rows, temperature) if rows is not None else None
    out = []
    for a, s in zip(arms, summ, strict=True):
        if ladder.settled(s, tw):
            continue
        if noise is not None and s.get("rounds") == 1 and s.get("e2e_lo_at_budget") is None and tw.max_runs:
            lo = _lo_at_budget(rows, a, tw, noise, temperature, fresh_prompts=fresh_prompts)
            if lo is not None and lo <= tw.min_speedup * (1 + tw.margin):
                s["e2e_lo_at_budget"] = lo
                s["budget"] = (f"futile: its estimate ({lo:.2f}×) shows no gain beyond ±{tw.margin:.0%}; "
                               f"{fresh_prompts} more prompts would not make it win" if fresh_prompts else
                               f"futile: even {tw.max_runs} rounds would leave the CI's lower end near {lo:.2f}× "
                               "(the A/A arm's round noise)")
                continue
        out.append(a)
    return out


def round_noise(rows: pd.DataFrame, temperature: float = 0.0) -> float | None:
    """The variance of a log ratio from round noise alone: plain over plain (the A/A arm's
    pairs), which has no prompt effect. None without two A/A pairs."""
    pairs = decide.paired(rows, arm={"drafter": decide.AA, "k": 0}, temperature=temperature)
    r = pairs["ratio"].to_numpy(float)
    r = np.log(r[np.isfinite(r) & (r > 0)])
    return float(np.var(r, ddof=1)) if len(r) >= 2 else None


def _lo_at_budget(rows: pd.DataFrame, arm: Arm, th: ladder.Thresholds, noise: float, temperature: float, *,
                  fresh_prompts: int = 0):
    """The CI's lower end after ``th.max_runs`` rounds: the prompt part of the spread stays,
    the round part (``noise``) shrinks as 1/rounds; the estimate stays where it is. With
    ``fresh_prompts`` the rounds measure new prompts instead, which narrow any interval as
    their count grows: the estimate itself is returned, the bound no number of prompts passes."""
    from scipy import stats

    pairs = decide.paired(rows, arm={"drafter": arm.drafter, "k": arm.k}, temperature=temperature)
    r = pairs["ratio"].to_numpy(float)
    ok = np.isfinite(r) & (r > 0)
    means = pd.Series(np.log(r[ok])).groupby(pairs["prompt"].to_numpy()[ok]).mean()
    n = len(means)
    if n < 2:
        return None
    prompt_part = max(0.0, float(means.var(ddof=1)) - noise)
    if fresh_prompts:  # new prompts can narrow any interval: only the estimate itself can rule them out
        return float(np.exp(float(means.mean()))) * th.min_speedup
    est = decide.estimate(pairs, **th.decide_kw())
    half = float(stats.t.ppf(1 - (1 - est.level) / 2, n - 1)) * np.sqrt((prompt_part + noise / th.max_runs) / n)
    return float(np.exp(float(means.mean()) - half)) * th.min_speedup


def _ci(s: dict) -> str:
    lvl = s.get("ci_level") or s.get("confidence") or decide.DEFAULT_CONFIDENCE
    return f"{s['e2e_speedup']:.2f}× ({lvl:.1%} CI {s['e2e_lo']:.2f}–{s['e2e_hi']:.2f})"


def decide_workload(workload: str, summ: list[dict], *, margin: float = decide.DEFAULT_MARGIN) -> dict:
    """On with the fastest candidate that wins end to end; else off (the simpler option),
    naming the best candidate measured. Every number is end-to-end, against plain. An off
    line names the margin: "no measurable difference" beside an interval of 1.01–1.38 read
    as a contradiction until one knew that a win must clear 1 + margin."""
    wins = [s for s in summ if s["verdict"] == decide.WINS]
    measured = [s for s in summ if s.get("e2e_speedup") is not None]
    if wins:
        top = max(wins, key=lambda s: s["e2e_speedup"])
        setting, why = ON, decide.WINS
    elif measured:
        top = max(measured, key=lambda s: s["e2e_speedup"])
        setting, why = OFF, top["verdict"]
    else:
        return {"workload": workload, "setting": OFF, "label": None, "drafter": None, "k": 0, "policy": False,
                "ratio": None, "lo": None, "hi": None, "verdict": decide.NO_DIFF, "candidates": 0,
                "line": f"{workload}: off, nothing measured"}
    n = len(summ)
    best = "" if setting == ON else f" (best of {n}: {top['label']} {_ci(top)})"
    line = (f"{workload}: on, {top['label']}, {_ci(top)} e2e, wins" if setting == ON
            else f"{workload}: off, {'loses' if why == decide.LOSES else f'no measurable difference beyond ±{margin:.0%}'}"
                 f"{best}")
    return {"workload": workload, "setting": setting, "label": top["label"], "drafter": top["drafter"],
            "k": int(top["k"]), "policy": bool(top.get("policy")), "ratio": top["e2e_speedup"], "lo": top["e2e_lo"],
            "hi": top["e2e_hi"], "level": top.get("ci_level"), "verdict": top["verdict"], "candidates": n,
            "acceptance": top.get("acceptance"), "rounds": top.get("rounds"), "prompts": top.get("prompts"),
            "line": line}


# -- 5. the held-out check -------------------------------------------------------------------
def check(decision: dict, rows: pd.DataFrame, *, margin: float = decide.DEFAULT_MARGIN,
          confidence: float = decide.DEFAULT_CONFIDENCE, temperature: float = 0.0) -> dict:
    """The decided candidate (for an off decision: the best candidate measured) on the
    held-out prompts ``rows``: its realised end-to-end ratio with its own CI and verdict,
    whether it lies inside the decision's interval, and the final setting.

    An "on" fails, and falls back to off, when the fresh prompts contradict it: the held-out
    loses, or is not faster at all (realised <= 1), or its own interval lies wholly below the
    decision's (realised_hi < lo). A realised ratio below the decision's interval whose own
    interval still reaches it is reported ("below") but kept: a few held-out prompts are
    noisier than the choosing ones, and failing on the point alone turned a right "on" off in
    one of three back-to-back runs (edit: 1.54x, 98.8% CI 1.40-1.70, held-out 1.33x, 95% CI
    0.98-1.80). What the check is there for, the winner's curse at the null, is caught by the
    "not faster" rule (test_search's simulations)."""
    out = {"workload": decision["workload"], "decided": decision["setting"], "label": decision.get("label"),
           "predicted": decision.get("ratio"), "predicted_lo": decision.get("lo"), "predicted_hi": decision.get("hi")}
    unmeasured = {**out, "realised": None, "realised_lo": None, "realised_hi": None, "realised_verdict": None,
                  "pairs": 0, "inside": None, "final": OFF}
    if decision.get("drafter") is None:
        return {**unmeasured, "failed": False, "line": f"{decision['workload']}: no candidate to check"}
    est = decide.compare(rows, arm={"drafter": decision["drafter"], "k": int(decision["k"])},
                         temperature=temperature, margin=margin, confidence=confidence)
    if est.ratio is None:
        return {**unmeasured, "failed": decision["setting"] == ON,
                "line": f"{decision['workload']}: held-out check measured no pairs: off"}
    lo, hi = decision.get("lo"), decision.get("hi")
    inside = bool(lo is not None and hi is not None and lo <= est.ratio <= hi)
    below = lo is not None and est.ratio < lo
    why = None
    if decision["setting"] == ON:
        if est.verdict == decide.LOSES:
            why = "it loses on them"
        elif est.ratio <= 1.0:
            why = "it is not faster on them"
        elif lo is not None and est.hi is not None and est.hi < lo:
            why = "its interval lies below the decision's"
    failed = why is not None
    final = OFF if failed else decision["setting"]
    where = "inside" if inside else ("below" if below else "above")
    text = (f"{decision['workload']}: {decision['label']} predicted {decision['ratio']:.2f}× "
            f"[{lo:.2f}–{hi:.2f}], held-out {est.ci_text()} {est.verdict} over {est.n_prompts} prompts: {where}")
    if failed:
        text += f"; the check fails ({why}): off (the simpler option)"
    elif below and decision["setting"] == ON:
        text += " (its own interval reaches the decision's: kept)"
    return {**out, "realised": est.ratio, "realised_lo": est.lo, "realised_hi": est.hi,
            "realised_verdict": est.verdict, "pairs": est.n_pairs, "prompts": est.n_prompts, "inside": inside,
            "where": where, "failed": failed, "final": final, "line": text}


def sampled_line(rows: pd.DataFrame, arm: Arm, temperature: float, th: ladder.Thresholds) -> str:
    """A chosen setting at a sampled temperature (measured: the replay is exact for greedy only)."""
    est = decide.compare(rows, arm={"drafter": arm.drafter, "k": arm.k}, temperature=temperature, margin=th.margin,
                         confidence=th.confidence)
    return est.line(f"at T={temperature:g} (sampled) {arm.label}, end-to-end")


# -- 6. the mix ----------------------------------------------------------------------------
def mix(decisions: list[dict], weights: dict[str, float], *, margin: float = decide.DEFAULT_MARGIN) -> dict:
    """The whole traffic's end-to-end speedup when each workload runs its final setting:
    tokens are shared by ``weights``, so time adds up as sum(w / s) (a harmonic mean). Off
    workloads run at 1.00×. The interval puts every "on" workload at its interval's end at
    once: conservative (wider than a joint 95% interval), and said so."""
    s, lo, hi = 0.0, 0.0, 0.0
    ons = []
    for d in decisions:
        w = weights.get(d["workload"], 0.0)
        on = d.get("final", d["setting"]) == ON and d.get("ratio")
        r, a, b = (d["ratio"], d["lo"], d["hi"]) if on else (1.0, 1.0, 1.0)
        s, lo, hi = s + w / r, lo + w / a, hi + w / b
        if on and w > 0:
            ons.append(d["workload"])
    ratio, lo_, hi_ = 1 / s, 1 / lo, 1 / hi
    verdict = decide.verdict_of(lo_, hi_, margin) if ons else decide.NO_DIFF
    line = (f"the mix ({', '.join(f'{w} {v:.0%}' for w, v in weights.items() if v)}): "
            + (f"{ratio:.2f}× e2e (every workload at its interval's ends: {lo_:.2f}–{hi_:.2f}), {verdict}; on for "
               f"{', '.join(ons)}" if ons else "off everywhere, 1.00× (nothing wins)"))
    return {"ratio": ratio, "lo": lo_, "hi": hi_, "verdict": verdict, "on": ons, "line": line}


def ladder_line(steps: pd.DataFrame | None, decisions: list[dict]) -> str | None:
    """One line where the chapter's ladder and the search disagree: "the chapter's ladder
    stopped at n_max=1 (0.82×, loses); the search found ngram k=5 on edit (1.45×, …, wins)"."""
    if steps is None or steps.empty:
        return None
    s = steps[(steps["drafter"] != decide.AA) & steps["measured"].fillna(True).astype(bool)] \
        if "measured" in steps else steps[steps["drafter"] != decide.AA]
    if s.empty:
        return None
    found = [d for d in decisions if d.get("final", d["setting"]) == ON]
    stopped = s[~s["passed"].astype(bool)]
    if stopped.empty or not found:
        return None  # both off, or the ladder climbed: no disagreement to state
    st = stopped.sort_values("k").iloc[0]
    top = max(found, key=lambda d: d["ratio"])
    return (f"the chapter's ladder stopped at n_max={int(st['k'])} ({st['drafter']} {st['e2e_speedup']:.2f}×, "
            f"{st['verdict']}); the search found {top['label']} on {top['workload']} "
            f"({top['ratio']:.2f}×, CI {top['lo']:.2f}–{top['hi']:.2f}, wins)")


def server_flags(d: dict, policy_flags: str | None = None, *, ngram_n: int = 4) -> str | None:
    """The llama-server flags that implement an "on" decision (None for off), as
    ``measure.serve.server_args`` passes them: n-gram lookup at a fixed k is ngram-simple
    with an m-gram of k (its draft length; --spec-draft-n-max does not bound it), a draft
    model is draft-simple at --spec-draft-n-max k; the priced policy cannot be passed to
    llama-server, so its closest fixed flags are given (``verdicts.llama_server_flags``)."""
    if d.get("final", d.get("setting")) != ON:
        return None
    if d.get("policy"):
        return policy_flags
    k = int(d["k"])
    base = f"--spec-draft-n-max {k} --spec-draft-n-min 0"
    if d["drafter"] == "ngram":
        return (f"--spec-type ngram-simple {base} --spec-ngram-simple-size-m {k} "
                f"--spec-ngram-simple-size-n {min(ngram_n, k)}")
    if d["drafter"] == "model":
        return f"--spec-type draft-simple {base} -md <draft model .gguf>"
    return base


# -- what 02 logs and prints -----------------------------------------------------------------
def split_policy_rows(rows: pd.DataFrame) -> tuple[pd.DataFrame, pd.DataFrame]:
    """(fixed-k rows, policy rows): the sweep's tables and figures are of fixed (drafter, k)
    cells; the policy's rows get their own table and verdict (``verdicts.policy_table``)."""
    if "policy" not in rows:
        return rows, rows.iloc[:0]
    pol = rows["policy"].notna()
    return rows[~pol].reset_index(drop=True), rows[pol | (rows["k"] == 0)].reset_index(drop=True)


DECISION_COLUMNS = ["workload", "final", "setting", "label", "drafter", "k", "policy", "ratio", "lo", "hi", "level",
                    "verdict", "candidates", "rounds", "prompts", "acceptance", "predicted_rank1", "check_realised",
                    "check_lo", "check_hi", "check_verdict", "check_inside", "check_failed", "sampled", "llama_server",
                    "line", "check"]


def decisions_table(res: dict) -> pd.DataFrame:
    """One row per workload: the decision (what was measured and judged on the choosing
    prompts), the replay's best-ranked setting, the held-out check and the final setting."""
    ranked = res["ranked"]
    out = []
    for d, c in zip(res["decisions"], res["checks"], strict=True):
        top = ranked[(ranked["workload"] == d["workload"]) & (ranked["rank"] == 1)]
        pred = (f"{top.iloc[0]['drafter']} k={int(top.iloc[0]['k'])} {top.iloc[0]['pred_e2e_gm']:.2f}× predicted"
                if len(top) else None)
        out.append({**{k: d.get(k) for k in DECISION_COLUMNS if k in d}, "predicted_rank1": pred,
                    "check_realised": c.get("realised"), "check_lo": c.get("realised_lo"),
                    "check_hi": c.get("realised_hi"), "check_verdict": c.get("realised_verdict"),
                    "check_inside": c.get("inside"), "check_failed": c.get("failed"),
                    "sampled": "; ".join(d.get("sampled") or []) or None})
    return pd.DataFrame(out, columns=DECISION_COLUMNS)


def final_line(d: dict) -> str:
    """A workload's final answer in one line: "edit: on, ngram k=5, 1.45× (98.8% CI 1.30–1.62)
    e2e, wins; held-out 1.41× inside" or "code: off, no measurable difference beyond ±2% (…)"."""
    if d.get("final", d["setting"]) == OFF and d["setting"] == ON:
        return f"{d['workload']}: off (the held-out check failed: {d.get('check', '')})"
    held = ""
    real = d.get("check_realised")
    if d["setting"] == ON and d.get("check_inside") is not None and real is not None and real == real:
        lo = d.get("lo")
        where = ("inside its interval" if d["check_inside"] else
                 "below its interval, whose end its own interval reaches (kept)" if lo is not None and real < lo
                 else "above its interval")
        held = f"; held-out {real:.2f}×, {where}"
    return d["line"] + held


def text(res: dict) -> str:
    """What 02 prints: the decision per workload, the mix, the ladder's record and where it
    disagrees, the held-out checks (predicted vs realised)."""
    lines = ["Decision per workload (end-to-end vs plain, chosen on the choosing prompts):"]
    lines += [f"  {final_line(d)}" for d in res["decisions"]]
    lines += [f"  {res['mix']['line']}"]
    for d in res["decisions"]:
        if d.get("llama_server"):
            lines.append(f"  llama-server for {d['workload']}: {d['llama_server']}")
        for s in d.get("sampled") or []:
            lines.append(f"  {d['workload']} {s}")
    if res.get("reserve"):
        ws = sorted({r.rsplit("-", 1)[0] for r in res["reserve"]})
        lines.append(f"Undecided after the first round: {', '.join(ws)}, measured again on "
                     f"{len(res['reserve'])} fresh reserve prompts (not on the same ones again)")
    if res.get("ladder_line"):
        lines.append(res["ladder_line"])
    inside = sum(bool(c.get("inside")) for c in res["checks"] if c.get("realised") is not None)
    checked = sum(c.get("realised") is not None for c in res["checks"])
    lines.append(f"Held-out check ({len(res['check'])} prompts never used to choose): realised inside the "
                 f"decision's interval for {inside} of {checked} workloads")
    lines += [f"  {c['line']}" for c in res["checks"]]
    return "\n".join(lines)


def tags(res: dict, *, source: str) -> dict:
    """The run tags the worksheet, advise and reproduce's summary read: each workload's final
    line, the mix, the ladder's disagreement, and ``protocol.winner`` (the fastest fixed
    setting turned on, for the tool-suite control; the policy's drafter at its best-ranked k
    when only k auto is on), with the ladder's own stop in ``protocol.stopped``."""
    import json

    on = [d for d in res["decisions"] if d.get("final") == ON]
    fixed = [d for d in on if not d.get("policy")]
    win = {"drafter": None, "k": 0}
    if fixed:
        top = max(fixed, key=lambda d: d["ratio"])
        win = {"drafter": top["drafter"], "k": int(top["k"])}
    elif on:
        top = max(on, key=lambda d: d["ratio"])
        r = res["ranked"]
        best = r[(r["workload"] == top["workload"]) & (r["drafter"] == top["drafter"].split("+")[0])]
        if len(best):
            win = {"drafter": str(best.iloc[0]["drafter"]), "k": int(best.iloc[0]["k"])}
    stopped = ladder.stopped_text(res["steps"]) if res["steps"] is not None and len(res["steps"]) else ""
    return {"search.decisions": json.dumps([{"workload": d["workload"], "final": d.get("final"),
                                             "line": final_line(d), "llama_server": d.get("llama_server")}
                                            for d in res["decisions"]]),
            "search.mix": res["mix"]["line"], "search.ladder": res.get("ladder_line") or "",
            "search.check": f"{sum(bool(c.get('inside')) for c in res['checks'])}/{len(res['checks'])} inside",
            "protocol.winner": json.dumps({**win, "source": source, "by": "search"}),
            "protocol.stopped": stopped[:5000]}
