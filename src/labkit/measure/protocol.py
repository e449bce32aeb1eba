"""The n_max protocol, measured: step k upward per drafter, stop at the first losing step.

Each step is one ``k_sweep`` of plain decoding and every still-active drafter at that k,
interleaved on the same prompts, so each step is paired with plain measured at the same
time (drift on a shared machine cannot pass for a win). Run indices are renumbered per
step (step s holds runs s*(runs+1) ..), so the concatenated rows pair every speculative
run with its own step's plain run in ``sweep_tables.cell_table`` too, and plain cells
pool every step's plain runs.

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
from collections.abc import Callable

import pandas as pd

from labkit.analysis import protocol as decide
from labkit.analysis import replay as rp
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
             skip: dict | None = None) -> dict:
    """Run the protocol; returns rows (every generation, ``k_sweep``'s columns plus
    ``protocol_step``), steps (the protocol-steps table), winner, winners, stopped, warnings.

    ``suite_check(drafter, k) -> verdict`` (``suites.stepcheck``) runs only for steps that
    pass the timing and acceptance criteria; ``residency`` (an engine's describe()
    ["residency"]) arms the spilled-experts guard. ``predicted`` (``predict``'s by_k table)
    lets the replay decide steps whose answer it already knows (``analysis.protocol.
    predicted_failure``): they are recorded as such and not measured.
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
                steps.append(decide.unmeasured_step(d, k, why, temp))
                active.remove(d)
                if progress:
                    progress(f"protocol: {d} k={k}: STOP without measuring ({why})")
        if not active:
            break
        w = decide.spill_warning(residency, k)
        if w and w not in warnings:
            warnings.append(w)
            warn(f"WARNING: {w}")
        rows = _measure(engine, prompts, {d: drafters[d] for d in active}, k, step_no, runs=runs,
                        max_tokens=max_tokens, temperatures=(temp,), seed=seed, interleave=interleave,
                        progress=progress, on_arm=on_arm, skip=skip)
        parts.append(rows)
        step_no += 1
        for d in list(active):
            s = decide.step_summary(rows, d, k, temperature=temp)
            timing_fails = decide.failures(s, previous=previous.get(d), th=thresholds)
            suite = suite_check(d, k) if (suite_check and not timing_fails) else None
            row = decide.judge(s, previous=previous.get(d), th=thresholds, suite=suite, last_k=k == spec_ks[-1])
            steps.append(row)
            if progress:
                progress(f"protocol: {d} k={k}: e2e {s['e2e_speedup']:.2f}x, "
                         + ("passed" if row["passed"] else f"STOP ({row['stop_reason']})"))
            if row["passed"]:
                previous[d] = s
            else:
                active.remove(d)
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
                              interleave=interleave, progress=progress, on_arm=on_arm, skip=skip))
    return {"rows": pd.concat(parts, ignore_index=True), "steps": table, "winner": win,
            "winners": decide.winners(table), "stopped": decide.stopped_text(table), "warnings": warnings,
            "temperature": temp}


def _pred(predicted: pd.DataFrame | None, drafter: str, k: int, temp: float) -> dict | None:
    if predicted is None or predicted.empty or temp != 0.0:  # the replay is exact for greedy only
        return None
    hit = predicted[(predicted["drafter"] == drafter) & (predicted["k"] == k)]
    return hit.iloc[0].to_dict() if len(hit) else None


def _measure(engine, prompts, drafters, k, step_no, *, runs, **kw) -> pd.DataFrame:
    # each step's arms are journaled under their own prefix (its plain arms repeat per step);
    # only the first step has a cold round: later steps run prompts the engine has just run
    rows = k_sweep(engine, prompts, drafters=drafters, ks=[0, k], runs=runs, key_prefix=f"step{step_no}-k{k}",
                   cold_round=step_no == 0, **kw)
    rows["run"] = rows["run"] + step_no * (runs + 1)
    rows["protocol_step"] = k
    return rows


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
