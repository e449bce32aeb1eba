"""The search, measured: choose per workload where the replay points, prove it on held-out prompts.

``analysis.search`` says what the search is and why (the chapter's ladder stops on its
worst rung on a CPU). This module drives it: the seeded split, the replay on the choosing
prompts (``measure.protocol.predict``), the ranking, then per workload one interleaved
sweep of plain, the A/A arm, its candidates and the ladder's first rung, and one more round
at a time for the candidates still undecided (within ``max_runs`` rounds and ``budget_s``
seconds per workload); then the held-out check of every decision, and the sampled
temperatures (which the replay cannot predict) for the settings turned on.

``measure`` is the one function that runs arms (``sweep.k_sweep``'s signature): the
simulation tests pass their own, with known true effects, so the driver under test is the
one that runs here.
"""

from __future__ import annotations

import time
from collections.abc import Callable

import pandas as pd

from labkit.analysis import protocol as ladder
from labkit.analysis import search as sr
from labkit.config.recipe import mix_weights
from labkit.errors import LabkitError
from labkit.measure import protocol as mp
from labkit.measure.sweep import k_sweep

Progress = Callable[[str], None] | None
# the ladder's first rung is a record, not a candidate: measured on this many choosing prompts per
# workload (pooled over the workloads, as the chapter's protocol judges it), in the first round only
LADDER_PROMPTS = 2
# a drafter whose best case (every draft accepted) is this far below plain is not replayed: its D
# and H are timed apart, so a margin for their noise (10%: the A/A spread of a quiet box); the
# draft model of the default recipe reads 0.75-0.77 on a family 25 box (D 20.4 ms, H 19.6 ms)
PRUNE_MARGIN = 0.10


def from_recipe(recipe, engine, prompts: list, *, drafters: dict, vm, predicted: dict | None = None,
                policies: dict | None = None, progress: Progress = None, **kw) -> dict:
    """``search`` with the recipe's fields (02's call): ``vm`` is the verify(m) model it prices with."""
    R = recipe
    return search(engine, prompts, drafters=drafters, ks=R.k, V=vm.V, H=vm.H, predicted=predicted, policies=policies,
                  thresholds=ladder.Thresholds.from_recipe(R, adjust=1), n_fixed=R.search_candidates,
                  check_share=R.check_share, traffic_mix=R.traffic_mix, runs=R.runs, max_runs=R.max_runs,
                  budget_s=R.budget_s, max_tokens=R.max_tokens, temperatures=tuple(R.temperatures), seed=R.seed,
                  interleave=R.interleave, ngram_n=R.ngram_max, progress=progress, **kw)


def round_seconds(pred: pd.DataFrame, arms: dict[str, list[sr.Arm]], extra: int = 0) -> dict[str, float]:
    """Per workload, about how long one round takes: every arm (plain, the A/A arm, the
    candidates, ``extra`` more) at the plain run's decode time, from the replay's table
    (an upper bound for the speculative arms, which are faster when they pay)."""
    if pred is None or pred.empty:
        return {}
    per_prompt = pred.drop_duplicates(["workload", "prompt"])
    out = {}
    for w, g in per_prompt.groupby("workload"):
        n_arms = 2 + len(arms.get(w, [])) + extra
        out[w] = float(g["pred_plain_decode_ms"].sum()) * n_arms / 1e3
    return out


def check_budget(budget_s: float | None, seconds: dict[str, float]) -> None:
    """Refuse (before any candidate is measured) a budget smaller than one round."""
    if budget_s is None or not seconds:
        return
    w, need = max(seconds.items(), key=lambda x: x[1])
    if budget_s < need:
        raise LabkitError(f"budget_s = {budget_s:g} s is smaller than one round of the search's candidates "
                          f"(about {need:.0f} s for {w}, predicted from its plain runs)",
                          f"set budget_s to at least {need:.0f} (seconds of measuring per workload), or null for "
                          "no time limit")


def search(engine, prompts: list, *, drafters: dict, ks: list[int], thresholds: ladder.Thresholds, V, H: float,
           policies: dict | None = None, n_fixed: int = 1, check_share: float = 0.4, traffic_mix: dict | None = None,
           runs: int = 2, max_runs: int | None = None, budget_s: float | None = None, max_tokens: int = 64,
           temperatures: tuple[float, ...] = (0.0,), seed: int = 0, interleave: str = "random",
           progress: Progress = None, on_arm: Callable | None = None, skip: dict | None = None,
           measure: Callable | None = None, predicted: dict | None = None, ngram_n: int = 4,
           reserve: list | None = None) -> dict:
    """The whole search; returns its tables and lines (see the keys at the end).

    ``reserve``: more choosing prompts (``suites.workloads.reserve_for``), measured only in the
    rounds after the first, only for a workload's still-undecided candidates, split evenly over
    those rounds: each such round measures them on fresh prompts instead of repeating the
    choosing ones. More prompts narrow the spread over prompts, which is most of a workload's
    interval and which repeating a prompt leaves as it is. Without a reserve (or once it is
    spent) a round repeats the choosing prompts.

    ``policies``: ``measure.policy_arm.policy_arms``' arms (the priced policy per drafter),
    each a candidate beside the ranked fixed settings. ``predicted``: ``measure.protocol.
    predict``'s result on the choosing prompts, when the caller already has it."""
    measure = measure or k_sweep
    temp = mp.decision_temperature(temperatures)
    weights = mix_weights(traffic_mix, sorted({p.workload for p in prompts}))
    choose, check = sr.split(prompts, check_share=check_share, seed=seed)
    max_runs = max_runs or runs
    pol = {k: v for k, v in (policies or {}).items() if not k.startswith("_")}
    kw = {"max_tokens": max_tokens, "seed": seed, "interleave": interleave, "progress": progress,
          "on_arm": on_arm, "skip": skip}
    t_start = time.perf_counter()

    pred = predicted or predict(engine, choose, drafters=drafters, ks=ks, max_tokens=max_tokens, V=V, H=H,
                                progress=progress)
    pruned = pred.get("pruned") or {}
    ranked = sr.rank(pred["per_prompt"])
    auto = {name.split("+")[0]: sr.Arm(name, int(kmax), policy=True) for name, (_, _, kmax) in pol.items()}
    arms = sr.arms_for(ranked, n_fixed=n_fixed, auto=auto)
    rung = _ladder_rung(pred["by_k"], drafters, ks, thresholds, pruned=pruned)
    check_budget(budget_s, round_seconds(pred["per_prompt"], arms, extra=len(rung["measure"])))

    parts, summ_by, decisions, used_reserve = [], {}, [], []
    for w in sorted(arms):
        ps = [p for p in choose if p.workload == w]
        a = arms[w]
        if progress:
            progress(f"search: {w}: measuring {', '.join(x.label for x in a)} against plain and A/A on "
                     f"{len(ps)} choosing prompts")
        # the replay has just run each choosing prompt: no cold round. The ladder's rung is a record,
        # measured on the first LADDER_PROMPTS choosing prompts of each workload, in the first round
        lad, rest = ps[:LADDER_PROMPTS], ps[LADDER_PROMPTS:]
        rows = pd.concat([_run(measure, engine, group, drafters, arm_set, pol, runs=runs, prefix=f"search-{w}",
                               temperatures=(temp,), cold=False, first=1, **kw)
                          for group, arm_set in ((lad, [*a, *rung["measure"]]), (rest, a)) if group],
                         ignore_index=True)
        batches = _batches([p for p in (reserve or []) if p.workload == w], max_runs - runs)
        r, t0 = runs, time.perf_counter()
        while True:
            summ = sr.summaries(rows, a, thresholds, temperature=temp)
            open_ = sr.open_arms(summ, a, thresholds, rows=rows, temperature=temp,
                                 fresh_prompts=sum(len(b) for b in batches))
            spent = budget_s is not None and time.perf_counter() - t0 >= budget_s
            if not open_ or r >= max_runs or spent:
                for s, x in zip(summ, a, strict=True):
                    if x in open_:
                        s["budget"] = "time budget spent" if spent else f"{r} of max_runs={max_runs} rounds"
                break
            r += 1
            fresh = batches.pop(0) if batches else []
            if progress:
                progress(f"search: {w}: round {r} for the undecided {', '.join(x.label for x in open_)}"
                         + (f" on {len(fresh)} fresh reserve prompts" if fresh else ""))
            more = _run(measure, engine, fresh or ps, drafters, open_, pol, runs=r, first_round=r,
                        prefix=f"search-{w}", temperatures=(temp,), cold=False, **kw)
            used_reserve += [p.id for p in fresh]
            rows = pd.concat([rows, more], ignore_index=True)
        parts.append(rows.assign(phase="choose"))
        summ_by[w] = summ
        d = sr.decide_workload(w, summ, margin=thresholds.margin)
        decisions.append(d)
        if progress:
            progress(f"search: {d['line']}")
    choose_rows = pd.concat(parts, ignore_index=True)

    checks, check_parts = [], []
    for d in decisions:
        w = d["workload"]
        ps = [p for p in check if p.workload == w]
        if d["drafter"] is None or not ps:
            checks.append(sr.check(d, pd.DataFrame(), margin=thresholds.margin, confidence=thresholds.confidence))
            continue
        x = sr.Arm(d["drafter"], int(d["k"]), policy=bool(d["policy"]))
        # the candidate against plain on prompts the search never saw; the run's A/A arm is in the choosing rounds
        rows = _run(measure, engine, ps, drafters, [x], pol, runs=runs, prefix=f"check-{w}", temperatures=(temp,),
                    control=False, **kw)
        check_parts.append(rows.assign(phase="check"))
        c = sr.check(d, rows, margin=thresholds.margin, confidence=thresholds.confidence, temperature=temp)
        checks.append(c)
        if progress:
            progress(f"search: held-out {c['line']}")
    check_rows = pd.concat(check_parts, ignore_index=True) if check_parts else pd.DataFrame()
    for d, c in zip(decisions, checks, strict=True):
        d.update(final=c["final"], check=c["line"], check_inside=c["inside"], check_failed=c["failed"],
                 check_realised=c.get("realised"))

    sampled = []
    others = tuple(t for t in temperatures if t != temp)
    for d in decisions:
        if not others or d["final"] != sr.ON:
            continue
        ps = [p for p in choose if p.workload == d["workload"]]
        x = sr.Arm(d["drafter"], int(d["k"]), policy=bool(d["policy"]))
        rows = _run(measure, engine, ps, drafters, [x], pol, runs=runs, prefix=f"sampled-{d['workload']}",
                    temperatures=others, cold=False, lossless=False, **kw)
        sampled.append(rows.assign(phase="sampled"))
        d["sampled"] = [sr.sampled_line(rows, x, t, thresholds) for t in others]
    all_rows = pd.concat([choose_rows, *sampled], ignore_index=True)

    steps = _ladder_steps(choose_rows, rung, thresholds, temp)
    policy_flags = _policy_flags(all_rows, temp, thresholds)
    for d in decisions:
        d["llama_server"] = sr.server_flags(d, policy_flags.get(d["drafter"]), ngram_n=ngram_n)
    mixed = sr.mix(decisions, weights, margin=thresholds.margin)
    return {"rows": all_rows, "check_rows": check_rows, "ranked": ranked, "arms": arms, "decisions": decisions,
            "checks": checks, "mix": mixed, "weights": weights, "steps": steps, "prediction": pred,
            "ladder_line": sr.ladder_line(steps, decisions), "choose": [p.id for p in choose],
            "check": [p.id for p in check], "reserve": used_reserve, "temperature": temp,
            "seconds": time.perf_counter() - t_start,
            "pruned": pruned,
            "summaries": summ_by}


def predict(engine, choose: list, *, drafters: dict, ks: list[int], max_tokens: int, V, H: float,
            progress: Progress = None) -> dict:
    """``measure.protocol.predict`` on the choosing prompts, for the drafters that could win
    (``prune``); ``"pruned"`` says which were left out and why."""
    replayed, pruned = prune(engine, choose[0], drafters, ks=ks, V=V, H=H, max_tokens=max_tokens, progress=progress)
    return {**mp.predict(engine, choose, drafters=replayed, ks=ks, max_tokens=max_tokens, V=V, H=H,
                         progress=progress), "pruned": pruned}


def prune(engine, prompt, drafters: dict, *, ks: list[int], V, H: float, max_tokens: int,
          progress: Progress = None) -> tuple[dict, dict]:
    """(the drafters to replay, {drafter: why not}): a drafter with an engine of its own (a
    draft model) is replayed only if it could beat plain at some k of ``ks`` even when
    every draft is accepted. One replay at k = 1 on one prompt measures its cost per drafted
    token D; the best case at k emits k + 1 tokens for k·D + V(k + 1), against (k + 1)·H
    plain; a drafter is left out when even that is more than ``PRUNE_MARGIN`` below plain.
    A draft model as dear per step as the target (this project's CPUs) can never win, and
    replaying it at every k on every choosing prompt costs minutes."""
    from labkit.analysis import replay as rp
    from labkit.decoding.loop import run, tokens_of

    spec = sorted(k for k in set(ks) if k > 0)
    keep, out, plain = {}, {}, None
    for name, d in drafters.items():
        if getattr(d, "own_engine", None) is None or not spec:
            keep[name] = d
            continue
        ids = list(prompt.ids) if getattr(prompt, "ids", None) else engine.tokenize(prompt.text)
        plain = plain or tokens_of(run(engine, ids, k=0, max_tokens=max_tokens))
        steps = [x for x in rp.replay(ids, plain, d, 1, max_tokens=max_tokens) if x["drafted"]]
        drafted = sum(x["drafted"] for x in steps)
        if not drafted:
            keep[name] = d
            continue
        D = sum(x["draft_ms"] for x in steps) / drafted
        bound, k = max(((k + 1) * H / (k * D + float(V(k + 1))), k) for k in spec)
        if bound >= 1 - PRUNE_MARGIN:  # a margin for the noise of two timings taken apart
            keep[name] = d
            continue
        out[name] = (f"cannot beat plain at any k even accepting every draft: it drafts at {D:.1f} ms a token "
                     f"against a plain step of {H:.1f} ms (best case {bound:.2f}× at k={k}); not replayed")
        if progress:
            progress(f"search: {name}: {out[name]}")
    return keep, out


def _batches(prompts: list, rounds: int) -> list[list]:
    """``prompts`` split into ``rounds`` consecutive, nearly equal batches (the first ones the
    larger); none for no prompts or no rounds."""
    if not prompts or rounds < 1:
        return []
    size, extra = divmod(len(prompts), rounds)
    out, i = [], 0
    for j in range(rounds):
        n = size + (j < extra)
        if n:
            out.append(prompts[i:i + n])
        i += n
    return out


def _run(measure, engine, prompts, drafters, arms: list[sr.Arm], policies: dict, *, runs: int, prefix: str,
         temperatures, first_round: int | None = None, first: int | None = None, cold: bool = True,
         lossless: bool = True, control: bool = True, **kw):
    fixed = [(x.drafter, x.k) for x in arms if not x.policy]
    pol = {x.drafter: policies[x.drafter] for x in arms if x.policy}
    used = {d: drafters[d] for d, _ in fixed} | {policies[x.drafter][0]: drafters[policies[x.drafter][0]]
                                                 for x in arms if x.policy}
    return measure(engine, prompts, drafters=used, ks=[0], arm_list=fixed, policies=pol, runs=runs,
                   temperatures=tuple(temperatures), key_prefix=prefix, control=control,
                   cold_round=cold and not first_round, first_round=first_round or first, check_lossless=lossless, **kw)


def _ladder_rung(pred_by_k: pd.DataFrame, drafters: dict, ks: list[int], th: ladder.Thresholds, *,
                 pruned: dict | None = None) -> dict:
    """The chapter's ladder, kept as a record: its first rung (the smallest k) for every
    drafter, measured inside the search's rounds unless the replay (or the best-case bound
    that ``prune`` applied) already decides it."""
    spec = sorted(k for k in set(ks) if k > 0)
    if not spec:
        return {"k": None, "measure": [], "decided": {}}
    k1 = spec[0]
    decided = {d: (f"cannot win: {why}", None) for d, why in (pruned or {}).items()}
    for d in drafters:
        if d in decided:
            continue
        p = mp._pred(pred_by_k, d, k1, 0.0)
        why = ladder.predicted_failure(p, th, margin=mp.SKIP_MARGIN)
        if why:
            decided[d] = (why, p)
    if len(decided) == len(drafters):
        decided = {}  # as the ladder itself: its first step is measured for the record
    return {"k": k1, "measure": [sr.Arm(d, k1) for d in drafters if d not in decided], "decided": decided}


def _ladder_steps(rows: pd.DataFrame, rung: dict, th: ladder.Thresholds, temp: float) -> pd.DataFrame:
    """The ladder's record in the protocol-steps table's shape: the A/A row, then each
    drafter's first rung, pooled over workloads as the chapter's protocol judges it."""
    steps = []
    aa = ladder.aa_row(rows, temperature=temp, th=th)
    if aa is not None:
        steps.append(aa)
    k1 = rung["k"]
    for d, (why, p) in rung["decided"].items():
        steps.append(ladder.unmeasured_step(d, k1, why, temp, pred=p))
    for x in rung["measure"]:
        s = ladder.step_summary(rows, x.drafter, x.k, temperature=temp, th=th)
        row = ladder.judge(s, previous=None, th=th)
        if row["passed"]:
            row["stop_reason"] = (f"passed; the ladder would step on to n_max={k1 + 1} "
                                  "(protocol: stepwise runs it whole)")
        steps.append(row)
    return pd.DataFrame(steps) if steps else pd.DataFrame(columns=ladder.STEP_COLUMNS)


def _policy_flags(rows: pd.DataFrame, temp: float, th: ladder.Thresholds) -> dict:
    """policy arm -> llama-server's closest fixed flags (the policy itself cannot be passed)."""
    from labkit.analysis import verdicts

    if "policy" not in rows:
        return {}
    tab = verdicts.policy_table(rows, temperature=temp, margin=th.margin, confidence=th.confidence)
    return {r["drafter"]: verdicts.llama_server_flags(tab[tab["drafter"] == r["drafter"]])
            for r in tab.to_dict("records")}

