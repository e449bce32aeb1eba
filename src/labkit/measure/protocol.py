"""The n_max protocol, measured: step k upward per drafter, stop at the first losing step.

Each step is one ``k_sweep`` of plain decoding and every still-active drafter at that k,
interleaved on the same prompts, so each step is paired with plain measured at the same
time (drift on a shared machine cannot pass for a win). Run indices are renumbered per
step (step s holds runs s*(max_runs+1) .., room for every round it may add), so the concatenated rows pair every speculative
run with its own step's plain run in ``sweep_tables.cell_table`` too, and plain cells
pool every step's plain runs.

Each step measures ``runs`` warm rounds, then adds one round at a time (all prompts,
interleaved, plain, the A/A arm and the still-undecided drafters) while a drafter's verdict
is not settled (``analysis.protocol.settled``) and the budget (``max_runs`` rounds,
``budget_s`` seconds) is not spent: clear cases stop after the minimum, marginal ones get
the rounds they need. The looks are corrected for (``Thresholds.looks``).

Steps are taken at one temperature (greedy when the recipe has it: the protocol's
decisions and the replay prediction are exact there); the winner is then measured at the
recipe's other temperatures against plain, so the sampled cells exist for the figures.
Decisions are made by ``analysis.protocol`` (pure, tested on constructed rows).

``predict`` is the other half: one plain greedy run per prompt, replayed for every k and
every replayable drafter (``analysis.replay``), priced with the verify fit: the whole
sweep predicted before any speculative arm is measured.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable

import pandas as pd

from labkit.analysis import protocol as decide
from labkit.analysis import replay as rp
from labkit.analysis.decide import NO_DIFF
from labkit.decoding.loop import run, tokens_of
from labkit.measure import order
from labkit.measure.sweep import k_sweep

# drafters whose greedy proposals are a function of the history alone (n-gram lookup, a
# greedy draft model): the replay is exact for them. MTP drafts from the target's hidden
# state, which a replay without the target does not have.
REPLAYABLE = ("ngram", "model")
# a predicted e2e speedup this far below the threshold is decided without measuring: well
# beyond the cost model's error on this project's cells (mostly within ±10%)
SKIP_MARGIN = 0.25


def decision_temperature(temperatures) -> float:
    return 0.0 if 0.0 in temperatures else float(temperatures[0])


def stepwise(engine, prompts: list, *, drafters: dict, ks: list[int], thresholds: decide.Thresholds,
             runs: int = 3, max_tokens: int = 128, temperatures: tuple[float, ...] = (0.0,), seed: int = 0,
             interleave: str = order.DEFAULT_POLICY, suite_check: Callable | None = None,
             residency: dict | None = None, predicted: pd.DataFrame | None = None, skip_margin: float = SKIP_MARGIN,
             warn: Callable = print, progress: Callable | None = None, on_arm: Callable | None = None,
             skip: dict | None = None, max_runs: int | None = None, budget_s: float | None = None,
             control: bool = True) -> dict:
    """Run the protocol; returns rows (every generation, ``k_sweep``'s columns plus
    ``protocol_step``), steps (the protocol-steps table), winner, winners, stopped, warnings.

    ``suite_check(drafter, k) -> verdict`` (``suites.stepcheck``) runs only for steps that
    pass the timing and acceptance criteria; ``residency`` (an engine's describe()
    ["residency"]) arms the spilled-experts guard. ``predicted`` (``predict``'s by_k table)
    lets the replay decide steps whose answer it already knows (``analysis.protocol.
    predicted_failure``): they are recorded as such and not measured. ``max_runs`` and
    ``budget_s`` bound the rounds added to undecided steps; ``control`` adds the A/A arm.
    """
    temp = decision_temperature(temperatures)
    spec_ks = sorted(k for k in set(ks) if k > 0)
    active = list(drafters)
    parts, steps, warnings = [], [], []
    previous: dict[str, dict] = {}
    step_no = 0
    for k in spec_ks:
        if not active:
            break
        known = {d: decide.predicted_failure(_pred(predicted, d, k, temp), thresholds, margin=skip_margin)
                 for d in active}
        if step_no == 0 and all(known.values()):
            known = {}  # never decide everything unmeasured: the first step is measured for the record
        for d, why in known.items():
            if why:
                steps.append(decide.unmeasured_step(d, k, why, temp, pred=_pred(predicted, d, k, temp)))
                active.remove(d)
                if progress:
                    progress(f"protocol: {d} k={k}: STOP without measuring ({why})")
        if not active:
            break
        w = decide.spill_warning(residency, k)
        if w and w not in warnings:
            warnings.append(w)
            warn(f"WARNING: {w}")
        kw = {"max_tokens": max_tokens, "temperatures": (temp,), "seed": seed, "interleave": interleave,
              "progress": progress, "on_arm": on_arm, "skip": skip, "control": control}
        rows, summaries = _measure_until_settled(engine, prompts, drafters, active, k, step_no, runs=runs,
                                                 max_runs=max_runs or runs, budget_s=budget_s, th=thresholds,
                                                 temp=temp, **kw)
        parts.append(rows)
        step_no += 1
        for d in list(active):
            s = summaries[d]
            timing_fails = decide.failures(s, previous=previous.get(d), th=thresholds)
            suite = suite_check(d, k) if (suite_check and not timing_fails) else None
            row = decide.judge(s, previous=previous.get(d), th=thresholds, suite=suite, last_k=k == spec_ks[-1])
            steps.append(row)
            if progress:
                progress(f"protocol: {decide.step_line(s)} after {s['rounds']} rounds: "
                         + ("passed" if row["passed"] else f"STOP ({row['stop_reason']})"))
            if row["passed"]:
                previous[d] = s
            else:
                active.remove(d)
    aa = decide.aa_row(pd.concat(parts, ignore_index=True), temperature=temp, th=thresholds) if parts else None
    if aa is not None:
        steps.insert(0, aa)
        if progress:
            progress(f"protocol: A/A control (plain vs plain): {aa['verdict']}"
                     + ("" if aa["passed"] else f" -- {aa['stop_reason']}"))
    table = pd.DataFrame(steps)
    if table.empty:
        table = pd.DataFrame(columns=[*decide.STEP_COLUMNS, "temperature", "pairs", "measured"])
    win = decide.winner(table)
    others = [t for t in temperatures if t != temp]
    if win["k"] > 0 and others:
        if progress:
            progress(f"protocol: winner {win['drafter']} k={win['k']} at T={others}")
        parts.append(_measure(engine, prompts, {win["drafter"]: drafters[win["drafter"]]}, win["k"], step_no,
                              runs=runs, max_tokens=max_tokens, temperatures=tuple(others), seed=seed,
                              interleave=interleave, progress=progress, on_arm=on_arm, skip=skip,
                              max_runs=max_runs or runs))
    return {"rows": pd.concat(parts, ignore_index=True), "steps": table, "winner": win,
            "winners": decide.winners(table), "stopped": decide.stopped_text(table), "warnings": warnings,
            "temperature": temp, "aa": aa, "reliable": None if aa is None else bool(aa["passed"])}


def _pred(predicted: pd.DataFrame | None, drafter: str, k: int, temp: float) -> dict | None:
    if predicted is None or predicted.empty or temp != 0.0:  # the replay is exact for greedy only
        return None
    hit = predicted[(predicted["drafter"] == drafter) & (predicted["k"] == k)]
    return hit.iloc[0].to_dict() if len(hit) else None


def _measure(engine, prompts, drafters, k, step_no, *, runs, max_runs=None, first_round=None,
             **kw) -> pd.DataFrame:
    # each step's arms are journaled under their own prefix (its plain arms repeat per step);
    # only the first step has a cold round: later steps run prompts the engine has just run
    rows = k_sweep(engine, prompts, drafters=drafters, ks=[0, k], runs=runs, key_prefix=f"step{step_no}-k{k}",
                   cold_round=step_no == 0, first_round=first_round, **kw)
    rows["run"] = rows["run"] + step_no * ((max_runs or runs) + 1)
    rows["protocol_step"] = k
    return rows


def _measure_until_settled(engine, prompts, drafters, active, k, step_no, *, runs, max_runs, budget_s, th, temp,
                           **kw) -> tuple[pd.DataFrame, dict]:
    """The step's ``runs`` rounds, then one more round at a time for the drafters whose
    verdict is not settled, within ``max_runs`` rounds and ``budget_s`` seconds."""
    t0 = time.perf_counter()
    rows = _measure(engine, prompts, {d: drafters[d] for d in active}, k, step_no, runs=runs, max_runs=max_runs,
                    **kw)
    r = runs
    while True:
        summaries = {d: decide.step_summary(rows, d, k, temperature=temp, th=th) for d in active}
        open_ = [d for d in active if not decide.settled(summaries[d], th)]
        spent = budget_s is not None and time.perf_counter() - t0 >= budget_s
        if not open_ or r >= max_runs or spent:
            for d in open_:
                why = "time budget spent" if spent else f"{r} of max_runs={max_runs} rounds"
                summaries[d]["budget"] = why
            for d in active:
                x = summaries[d]
                if (d not in open_ and x["verdict"] == NO_DIFF and x.get("e2e_lo_at_budget") is not None
                        and x["e2e_hi"] > th.min_speedup * (1 + th.margin)):
                    x["budget"] = (f"futile: even {max_runs} rounds would leave the CI's lower end near "
                                   f"{x['e2e_lo_at_budget']:.2f}×")
            return rows, summaries
        r += 1
        if kw.get("progress"):
            kw["progress"](f"protocol: k={k}: round {r} for the undecided {', '.join(open_)} "
                           f"({', '.join(decide.step_line(summaries[d]) for d in open_)})")
        more = _measure(engine, prompts, {d: drafters[d] for d in open_}, k, step_no, runs=r, max_runs=max_runs,
                        first_round=r, **kw)
        rows = pd.concat([rows, more], ignore_index=True)


def predict(engine, prompts: list, *, drafters: dict, ks: list[int], max_tokens: int, V: Callable, H: float,
            overhead: tuple[float, float] | None = None, progress: Callable | None = None) -> dict:
    """The whole greedy sweep predicted from one plain run per prompt: per (drafter,
    workload, prompt, k) the replayed accept pattern, priced with verify(m) ``V`` and the
    plain step ``H``. Only ``REPLAYABLE`` drafters are predicted (the rest are listed).

    Drafters are reused across prompts and k: ``begin`` resets an n-gram index or a draft
    model's cache completely, which is what a fresh drafter would do. A draft model's
    prompt is computed once per prompt, at the first k (``Engine.prompt_reuse``: the same
    cells, so the same proposals); its measured begin time prices every k's first step.
    """
    replays, plain_runs, accept_ms = [], [], []
    names = [d for d in drafters if d in REPLAYABLE]
    own = {d: e for d in names if (e := drafters[d].own_engine) is not None}  # a draft model's engine
    for i, p in enumerate(prompts):
        ids = list(p.ids) if getattr(p, "ids", None) else engine.tokenize(p.text)
        recs = run(engine, ids, k=0, max_tokens=max_tokens)
        plain = tokens_of(recs)
        plain_runs.append({"prompt": p.id, "tokens": plain})
        accept_ms += [r.accept_ms for r in recs if r.mode == "plain"]
        for d in names:
            with own[d].prompt_reuse() if d in own else contextlib.nullcontext(False) as reused:
                sweep = rp.replay_sweep(ids, plain, lambda d=d: drafters[d], ks, max_tokens=max_tokens)
            if reused and sweep:
                first = min(sweep)
                for k, steps in sweep.items():  # the begin each k's real run pays: the one measured
                    if k != first:
                        steps[0].update(draft_ms=sweep[first][0]["draft_ms"], begin_measured_at_k=first)
            for k, steps in sweep.items():
                replays.append({"drafter": d, "workload": p.workload, "prompt": p.id, "k": k, "steps": steps,
                                "prefill_ms": recs[0].verify_ms + recs[0].accept_ms})
        if progress:
            progress(f"replay: {p.id} ({i + 1}/{len(prompts)}), {len(plain)} plain tokens")
    o = overhead or (_median(accept_ms), _median(accept_ms))  # bookkeeping is ~one argmax per verified row
    pred = rp.prediction_table(replays, V=V, H=H, overhead=o)
    return {"per_prompt": pred, "by_k": rp.prediction_by_k(pred) if not pred.empty else pred,
            "replays": replays, "plain": plain_runs, "not_replayable": [d for d in drafters if d not in names],
            "overhead": o}


def _median(v: list[float]) -> float:
    return float(pd.Series(v).median()) if v else 0.0
