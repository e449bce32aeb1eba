"""Tool-suite quality control: the same suite with speculation off and on.

"Speed features that quietly wreck behaviour are not speed features." Greedy runs
must agree token for token; any task whose output differs is listed with the position
and logit gap of its first divergence. Sampled runs (seeded, temperature > 0) use the
loop's distribution-preserving speculative sampling; the noise band is the spread of
the off runs' suite scores. The verdict applies the chapter's tolerance ("within the
suite's ±10 noise", ``tolerance_pts``) to every on run against that band, and says
whether the on median also sits inside the measured band. A paired test over tasks
(exact McNemar on the discordant task pairs, and a bootstrap over tasks of the score
difference) says whether on and off differ task by task, not only in total.
"""

from __future__ import annotations

import contextlib
import hashlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np
import pandas as pd

from labkit.analysis.lossless import divergence_report
from labkit.analysis.stats import summarize
from labkit.decoding.loop import run, tokens_of
from labkit.measure import arms
from labkit.suites import toolsuite


def run_suite(engine, tasks, *, drafter=None, k: int = 0, temperature: float = 0.0, seed: int = 0,
              max_tokens: int = toolsuite.MAX_TOKENS, make_gate: Callable | None = None) -> dict:
    """Every task once: its output, score and speed. Records are kept for divergence checks."""
    return run_blocks(engine, tasks, [Block(drafter, k, temperature, seed)], max_tokens=max_tokens,
                      make_gate=make_gate)[0]


def run_seed(seed: int, temperature: float, run: int) -> int:
    """The base seed of a suite run: ``seed`` for greedy, ``seed + 1000 * (run + 1)`` for sampled run ``run``."""
    return seed if temperature == 0 else seed + 1000 * (run + 1)


@dataclass(frozen=True)
class Block:
    """One suite run: every task once with this drafter (None: speculation off), k,
    temperature and base seed (task i is seeded ``seed + i``)."""

    drafter: object | None
    k: int
    temperature: float
    seed: int


def run_blocks(engine, tasks, blocks: list[Block], *, max_tokens: int = toolsuite.MAX_TOKENS,
               make_gate: Callable | None = None, on_task: Callable | None = None,
               done: Callable | None = None) -> list[dict]:
    """Several suite runs (``blocks``) over the same tasks, task by task: per block the
    ``run_suite`` result (summary, rows, records, prompts).

    Task by task so that each task's prompt is computed once for all its blocks
    (``Engine.prompt_reuse``: the same KV cells and last-row logits, so every block's
    output is what block-by-block runs give; prefill times are not measured here). The
    few-shot preamble every task shares stays cached across tasks (``keep_prefix``).
    ``on_task(task, results)`` is called as each task finishes, with its (row, records)
    per block; ``done(task)`` may return such a list for a task measured earlier (resume).
    """
    stops = engine.tokens_containing(toolsuite.STOP)
    prompts = {t.id: engine.tokenize(toolsuite.build_prompt(t)) for t in tasks}
    keep = _common_prefix(list(prompts.values()))
    acc = [{"rows": [], "scores": [], "records": {}} for _ in blocks]
    with contextlib.ExitStack() as stack:
        for e in _engines(engine, blocks):
            stack.enter_context(e.prompt_reuse())
        for i, task in enumerate(tasks):
            got = done(task) if done is not None else None
            if got is None:
                got = [_run_task(engine, task, prompts[task.id], b, seed=b.seed + i, keep=keep, stops=stops,
                                 max_tokens=max_tokens, make_gate=make_gate) for b in blocks]
                if on_task is not None:
                    on_task(task, got)
            for a, (row, recs) in zip(acc, got):
                a["rows"].append(row)
                a["scores"].append(_score(row))
                a["records"][task.id] = recs
    return [{"summary": toolsuite.summarize(a["scores"]), "rows": pd.DataFrame(a["rows"]), "records": a["records"],
             "prompts": prompts} for a in acc]


def control_plan(drafters: dict, *, k: int, runs: int | Sequence[int], temperature: float, seed: int,
                 greedy: bool = True) -> list[tuple[tuple, Block]]:
    """``control``'s suite runs in order, each as ((temperature, drafter name or None, run), Block):
    greedy off, greedy on per drafter (``greedy``), then the sampled runs off, then on per
    drafter. ``runs``: how many sampled runs (0..runs-1), or which run numbers."""
    rs = list(range(runs)) if isinstance(runs, int) else list(runs)
    plan = (([(0.0, None, 0)] + [(0.0, n, 0) for n in drafters] if greedy else [])
            + [(temperature, None, r) for r in rs] + [(temperature, n, r) for n in drafters for r in rs])
    return [((temp, n, r), Block(drafters[n] if n else None, k if n else 0, temp, run_seed(seed, temp, r)))
            for temp, n, r in plan]


def _engines(engine, blocks: list[Block]) -> list:
    """The target and every draft model's engine the blocks use (each reuses its prompts)."""
    out = [engine]
    for b in blocks:
        e = b.drafter.own_engine if b.drafter is not None else None
        if e is not None and all(e is not x for x in out):
            out.append(e)
    return out


def _score(row: dict) -> toolsuite.TaskScore:
    """The task's score as its row recorded it (measured now, or restored from the journal)."""
    return toolsuite.TaskScore(id=row["task"], category=row["category"], error=row["error"],
                               **{c: row[c] for c in toolsuite.CRITERIA})


def _run_task(engine, task, ids, b: Block, *, seed: int, keep: int, stops, max_tokens: int,
              make_gate: Callable | None) -> tuple[dict, list]:
    """One task of one block: its table row and step records."""
    recs = run(engine, ids, drafter=b.drafter, k=b.k, max_tokens=max_tokens, temperature=b.temperature, seed=seed,
               gate=make_gate() if (make_gate and b.k > 0) else None, stop_tokens=stops, keep_prefix=keep)
    text = engine.detokenize(tokens_of(recs))
    sc = toolsuite.score_task(task, text)
    s = summarize(recs)
    return ({"task": task.id, "category": task.category, "correct": sc.correct, "parsed": sc.parsed,
             "valid": sc.valid, "right_tool": sc.right_tool, "right_args": sc.right_args, "error": sc.error,
             "output": text, "tokens": s.tokens, "decode_tok_s": s.decode_tok_s, "acceptance": s.acceptance}, recs)


def _common_prefix(seqs: list[list[int]]) -> int:
    if len(seqs) < 2:
        return 0
    n = min(len(s) for s in seqs)
    first = seqs[0]
    for i in range(n):
        if any(s[i] != first[i] for s in seqs[1:]):
            return i
    return n


def greedy_divergences(engine, off: dict, on: dict) -> pd.DataFrame:
    """Tasks whose greedy output differs between off and on, with the first divergence explained."""
    out = []
    for task_id, recs_off in off["records"].items():
        recs_on = on["records"][task_id]
        if tokens_of(recs_off) == tokens_of(recs_on):
            continue
        rep = divergence_report(engine, off["prompts"][task_id], recs_off, recs_on)
        d = rep["divergence"]
        row_off = off["rows"].set_index("task").loc[task_id]
        row_on = on["rows"].set_index("task").loc[task_id]
        out.append({"task": task_id, "index": d["index"], "plain_gap": d.get("plain_gap"),
                    "near_tie": d.get("near_tie", False), "correct_off": bool(row_off["correct"]),
                    "correct_on": bool(row_on["correct"])})
    return pd.DataFrame(out, columns=["task", "index", "plain_gap", "near_tie", "correct_off", "correct_on"])


DEFAULT_TOLERANCE_PTS = 10.0  # the chapter's "within the suite's ±10 noise", in percentage points
BOOTSTRAP_SAMPLES = 2000


def verdict(off_scores: list[float], on_scores: list[float], *,
            tolerance_pts: float = DEFAULT_TOLERANCE_PTS) -> dict:
    """Every on run within ``tolerance_pts`` points below the off runs' band, or the regression.

    Scores are fractions; points are percentage points. ``within_band`` says whether the
    on median also lies inside the measured min-max band of the off runs.
    """
    lo, hi = min(off_scores), max(off_scores)
    med, worst = float(np.median(on_scores)), min(on_scores)
    regression = max(0.0, 100 * (lo - med))  # the median's distance below the band
    worst_below = max(0.0, 100 * (lo - worst))
    within_tol = worst_below <= tolerance_pts + 1e-9  # 0.50 - 0.40 is 9.999… points in floats
    on_text = (f"on {worst:.1%}" if len(on_scores) == 1 else
               f"on {worst:.1%}-{max(on_scores):.1%} (median {med:.1%})")
    one = len(off_scores) == 1  # 04 stopped after one sampled run: no band to speak of
    band = f"off {lo:.1%} (one run: no band)" if one else f"off band {lo:.1%}-{hi:.1%}"
    inside = "at or above the off run" if one else "median inside the measured band"
    where = "the off run" if one else "the measured band"
    if within_tol:
        text = (f"within ±{tolerance_pts:g}: {on_text} vs {band}; "
                + (inside if med >= lo else f"median {regression:.1f} points below {where}"))
    else:
        text = (f"regression: {on_text} vs {band}; worst run {worst_below:.1f} points below the band "
                f"(median {regression:.1f}), beyond ±{tolerance_pts:g}")
    return {"verdict": text, "within_noise": within_tol, "within_band": med >= lo,
            "regression_points": regression, "worst_points_below": worst_below, "tolerance_pts": tolerance_pts,
            "off_band": [lo, hi], "on_median": med, "on_range": [worst, max(on_scores)]}


def paired_test(off: pd.DataFrame, on: pd.DataFrame, *, n_boot: int = BOOTSTRAP_SAMPLES, seed: int = 0,
                confidence: float = 0.95) -> dict:
    """On vs off task by task: frames with columns task, run, correct, paired on (task, run).

    ``lost``/``gained``: pairs correct off but not on / on but not off. ``mcnemar_p``: the
    exact McNemar test (two-sided binomial test of lost against lost + gained at 1/2).
    ``diff_pts`` (on minus off, points) with a percentile bootstrap CI resampling tasks,
    each task's difference averaged over its runs first (runs of one task are not independent).
    """
    from scipy.stats import binomtest

    m = off[["task", "run", "correct"]].merge(on[["task", "run", "correct"]], on=["task", "run"],
                                             suffixes=("_off", "_on"))
    if m.empty:
        raise ValueError("no (task, run) pairs in common")
    a, b = m["correct_off"].astype(bool), m["correct_on"].astype(bool)
    lost, gained = int((a & ~b).sum()), int((~a & b).sum())
    p = float(binomtest(lost, lost + gained, 0.5).pvalue) if lost + gained else 1.0
    per_task = (b.astype(float) - a.astype(float)).groupby(m["task"]).mean().to_numpy()
    rng = np.random.default_rng(seed)
    boot = per_task[rng.integers(0, len(per_task), (n_boot, len(per_task)))].mean(axis=1)
    tail = 100 * (1 - confidence) / 2
    return {"pairs": len(m), "tasks": len(per_task), "lost": lost, "gained": gained, "mcnemar_p": p,
            "diff_pts": 100 * float(per_task.mean()), "ci_low_pts": 100 * float(np.percentile(boot, tail)),
            "ci_high_pts": 100 * float(np.percentile(boot, 100 - tail)), "n_boot": n_boot, "confidence": confidence}


def run_passes(runs: int, min_runs: int | None) -> list[list[int]]:
    """The sampled runs of each pass over the suite: ``min_runs`` first, then one at a time
    up to ``runs`` (None: all ``runs`` in one pass)."""
    m = runs if min_runs is None else max(1, min(int(min_runs), runs))
    return [list(range(m))] + [[r] for r in range(m, runs)]


def look_level(passes: list[list[int]], alpha: float = 0.05) -> float | None:
    """The confidence of each look: 1 - alpha / (planned looks), Bonferroni; None when the
    plan has one pass (no look: the verdict is made on all runs, as without stopping)."""
    return 1 - alpha / len(passes) if len(passes) > 1 else None


def look(off: pd.DataFrame, on: pd.DataFrame, *, tolerance_pts: float, confidence: float, seed: int = 0) -> dict:
    """One interim look of the sampled runs so far: the paired score difference (on minus off,
    points) with its CI at ``confidence``; ``decided`` when the CI lies wholly above
    -tolerance (speculation costs the suite less than the tolerance) or wholly below it (a
    regression beyond it). Either way more runs would not change the answer at this level."""
    t = paired_test(off, on, seed=seed, confidence=confidence)
    above, below = t["ci_low_pts"] > -tolerance_pts, t["ci_high_pts"] < -tolerance_pts
    return {"runs": int(off["run"].nunique()), "diff_pts": t["diff_pts"], "ci_low_pts": t["ci_low_pts"],
            "ci_high_pts": t["ci_high_pts"], "confidence": confidence, "decided": bool(above or below),
            "answer": "within tolerance" if above else ("regression" if below else "undecided")}


def task_pairs(off: pd.DataFrame, on: pd.DataFrame) -> pd.DataFrame:
    """Per task and run: the output, correctness and error with speculation off and on."""
    cols = ["task", "run", "category", "correct", "error", "output"]
    m = off[cols].merge(on[cols].drop(columns="category"), on=["task", "run"], suffixes=("_off", "_on"))
    m["same_output"] = m["output_off"] == m["output_on"]
    return m


def control(engine, tasks, *, drafters: dict, k: int, runs: int = 3, temperature: float = 0.7, seed: int = 0,
            tolerance_pts: float = DEFAULT_TOLERANCE_PTS, progress: Callable | None = None,
            on_arm: Callable | None = None, skip: dict | None = None, min_runs: int | None = None,
            alpha: float = 0.05) -> dict:
    """Speculation off vs on for each drafter: greedy once each (deterministic), sampled ``runs`` times.

    Besides the scores: ``task_pairs`` (every task's output off vs on, per drafter,
    temperature and run) and ``paired`` (the paired test per drafter and temperature).
    The suite runs (blocks: greedy off, greedy on per drafter, then the sampled runs off
    and on) go task by task (``run_blocks``: each prompt computed once for all blocks of a
    pass), so one arm is one task with all its blocks of one pass; ``on_arm`` and ``skip``
    journal and resume tasks (see ``measure.arms``), each with its per-block rows and step
    records.

    Measured until the answer is known: ``min_runs`` (< ``runs``) sampled runs first, then
    one more over the whole suite at a time while some drafter's paired difference is
    undecided (``look``: its CI neither wholly above nor wholly below -tolerance), up to
    ``runs``. Each look's CI is at 1 - alpha / (planned looks), Bonferroni over the looks
    the plan allows, so stopping at the first decided look keeps the error rate at most
    alpha. Sampled run r is seeded as it always was, so a run measured is the same run
    whether or not the plan stopped early. ``min_runs`` None: exactly ``runs``.
    """
    say = progress or (lambda _m: None)
    # at temperature 0 the "sampled" runs are greedy ones again: nothing to decide run by run
    passes = run_passes(runs, min_runs if temperature > 0 else None)
    level = look_level(passes, alpha)
    taskset = "ts" + hashlib.sha256(",".join(t.id for t in tasks).encode()).hexdigest()[:8]
    tag = "+".join(drafters) or "none"

    def task_key(task, i):
        rs = passes[i]
        part = f"r{runs}" if len(passes) == 1 else f"r{rs[0]}-{rs[-1]}of{runs}"
        return arms.key(taskset, task.id, f"T{temperature:g}", tag, part, f"k{k}")

    plan: list[tuple] = []
    results: list[dict] = []
    looks: list[dict] = []
    stopped = None
    for i, rs in enumerate(passes):
        pass_plan, blocks = zip(*control_plan(drafters, k=k, runs=rs, temperature=temperature, seed=seed,
                                              greedy=i == 0))
        blocks = list(blocks)
        n_blocks = len(blocks)
        arms.plan(on_arm, [task_key(t, i) for t in tasks])

        def finished(task, got, i=i):
            row = {"task": task.id, "category": task.category, "blocks": len(got), "_rows": [r for r, _ in got]}
            arms.finished(on_arm, task_key(task, i), row, {f"b{j}": recs for j, (_, recs) in enumerate(got)})

        def restored(task, i=i, n=n_blocks):
            got = arms.restored(skip, task_key(task, i))
            if got is None:
                return None
            row, recs = got
            rows = row.get("_rows") or []
            if len(rows) != n or not isinstance(recs, dict):
                return None  # journaled by a different plan: measure it again
            return [(r, recs.get(f"b{j}")) for j, r in enumerate(rows)]

        what = (f"greedy off/on, T={temperature:g} off/on x {len(rs)}" if i == 0 else
                f"T={temperature:g} off/on, sampled run {rs[0] + 1} of up to {runs}")
        say(f"tool suite: {len(tasks)} tasks x {len(blocks)} runs ({what}), task by task")
        plan += list(pass_plan)
        results += run_blocks(engine, tasks, blocks, on_task=finished, done=restored)
        if level is None or not drafters or not rs:
            continue
        done_runs = rs[-1] + 1
        off_so_far = _sampled_rows(plan, results, None)
        look_rows = [{"drafter": name, **look(off_so_far, _sampled_rows(plan, results, name),
                                               tolerance_pts=tolerance_pts, confidence=level, seed=seed)}
                     for name in drafters]
        looks += look_rows
        say(f"tool suite after {done_runs} sampled run(s): " + "; ".join(
            f"{x['drafter']} {x['diff_pts']:+.1f} points ({x['confidence']:.1%} CI {x['ci_low_pts']:+.1f} to "
            f"{x['ci_high_pts']:+.1f}), {x['answer']}" for x in look_rows))
        if all(x["decided"] for x in look_rows) and done_runs < runs:
            stopped = (f"after {done_runs} of up to {runs} sampled runs: every drafter's paired difference "
                       f"is decided against -{tolerance_pts:g} points at {level:.1%} (Bonferroni over "
                       f"{len(passes)} looks)")
            say(f"tool suite: stop {stopped}")
            break
    # the sampled runs measured (at temperature 0 every planned run, whatever the keys say)
    n_runs = max([r for (t, _n, r) in plan if t > 0], default=-1) + 1 if temperature > 0 else runs

    def block(i):
        temp, name, r = plan[i]
        res = results[i]
        row = {"spec": "on" if name else "off", "drafter": name or "none", "temperature": temp, "run": r,
               "score": res["summary"]["score"]}
        if name and temp == 0:
            acc = res["rows"]["acceptance"]
            row["acceptance"] = float(acc.dropna().median()) if acc.notna().any() else None
        row.update(_cats(res))
        row["decode_tok_s"] = float(res["rows"]["decode_tok_s"].median())
        return res, row

    # the table in the canonical order (greedy off, greedy on per drafter, sampled off, then on per drafter)
    where: dict[tuple, int] = {}
    for i, key in enumerate(plan):
        where.setdefault(key, i)  # (at toolsuite_temperature 0 a sampled run's key is greedy's: the same output)
    table, divs, verdicts = [], [], {}
    off, row = block(where[(0.0, None, 0)])
    table.append(row)
    per_run: dict = {("none", "greedy"): [off["rows"].assign(run=0)]}
    for name in drafters:
        on, row = block(where[(0.0, name, 0)])
        table.append(row)
        per_run[(name, "greedy")] = [on["rows"].assign(run=0)]
        dv = greedy_divergences(engine, off, on)
        dv.insert(0, "drafter", name)
        divs.append(dv)
    sampled_off = []
    for r in range(n_runs):
        res, row = block(where[(temperature, None, r)])
        sampled_off.append(res["summary"]["score"])
        table.append(row)
        per_run.setdefault(("none", "sampled"), []).append(res["rows"].assign(run=r))
    for name in drafters:
        on_scores = []
        for r in range(n_runs):
            res, row = block(where[(temperature, name, r)])
            on_scores.append(res["summary"]["score"])
            table.append(row)
            per_run.setdefault((name, "sampled"), []).append(res["rows"].assign(run=r))
        verdicts[name] = verdict(sampled_off, on_scores, tolerance_pts=tolerance_pts)
    pairs, paired = [], []
    for name in drafters:
        for mode, temp in (("greedy", 0.0), ("sampled", temperature))[: 2 if n_runs else 1]:
            o = pd.concat(per_run[("none", mode)], ignore_index=True)
            n = pd.concat(per_run[(name, mode)], ignore_index=True)
            pairs.append(task_pairs(o, n).assign(drafter=name, k=k, mode=mode, temperature=temp))
            paired.append({"drafter": name, "k": k, "mode": mode, "temperature": temp,
                           **paired_test(o, n, seed=seed)})
    return {"scores": pd.DataFrame(table), "divergences": pd.concat(divs, ignore_index=True) if divs else
            pd.DataFrame(), "verdicts": verdicts, "greedy_off": off["summary"], "k": k,
            "temperature": temperature, "runs": n_runs, "max_runs": runs,
            "looks": pd.DataFrame(looks), "stopped": stopped, "tasks": len(tasks), "tolerance_pts": tolerance_pts,
            "task_pairs": pd.concat(pairs, ignore_index=True) if pairs else pd.DataFrame(),
            "paired": pd.DataFrame(paired)}


def runs_line(res: dict) -> str:
    """How many sampled runs ``control`` measured, of how many it could, and why it stopped."""
    return f"{res['runs']} of up to {res['max_runs']}" + (f" (stopped {res['stopped']})" if res["stopped"] else "")


def _sampled_rows(plan: list[tuple], results: list[dict], name: str | None) -> pd.DataFrame:
    """Every sampled run of one arm so far (``name`` None: speculation off), rows numbered by run."""
    return pd.concat([res["rows"].assign(run=r) for (t, n, r), res in zip(plan, results) if t > 0 and n == name],
                     ignore_index=True)


def _cats(res: dict) -> dict:
    return {f"score_{c}": v["score"] for c, v in res["summary"]["categories"].items()}


def verdict_table(res: dict) -> pd.DataFrame:
    """One row per drafter: greedy off/on, sampled band and median, verdict."""
    s = res["scores"]
    off_g = float(s[(s["spec"] == "off") & (s["temperature"] == 0)]["score"].iloc[0])
    rows = []
    for name, v in res["verdicts"].items():
        on_g = float(s[(s["drafter"] == name) & (s["temperature"] == 0)]["score"].iloc[0])
        ndiv = int((res["divergences"]["drafter"] == name).sum()) if not res["divergences"].empty else 0
        pt = res.get("paired")
        sampled = (pt[(pt["drafter"] == name) & (pt["mode"] == "sampled")]
                   if pt is not None and not pt.empty else pd.DataFrame())
        rows.append({"drafter": name, "k": res["k"], "greedy_off": off_g, "greedy_on": on_g,
                     "greedy_tasks_differing": ndiv, "sampled_T": res["temperature"],
                     "off_band_low": v["off_band"][0], "off_band_high": v["off_band"][1],
                     "on_median": v["on_median"], "on_low": v["on_range"][0], "on_high": v["on_range"][1],
                     "tolerance_pts": v.get("tolerance_pts"), "within_tolerance": v["within_noise"],
                     "mcnemar_p": float(sampled["mcnemar_p"].iloc[0]) if len(sampled) else None,
                     "verdict": v["verdict"]})
    return pd.DataFrame(rows)


def metrics(res: dict) -> dict[str, tuple[float, float | None, float | None]]:
    """name -> (value, low, high) for logging: greedy scores and the sampled bands."""
    s = res["scores"]
    out = {"toolsuite/greedy.off": (float(s[(s["spec"] == "off") & (s["temperature"] == 0)]["score"].iloc[0]),
                                    None, None)}
    off = s[(s["spec"] == "off") & (s["temperature"] > 0)]["score"]
    if len(off):
        out["toolsuite/sampled.off"] = (float(off.median()), float(off.min()), float(off.max()))
    for name, v in res["verdicts"].items():
        g = s[(s["drafter"] == name) & (s["temperature"] == 0)]["score"]
        out[f"toolsuite/greedy.on.{name}"] = (float(g.iloc[0]), None, None)
        out[f"toolsuite/sampled.on.{name}"] = (v["on_median"], v["on_range"][0], v["on_range"][1])
    pt = res.get("paired")
    for r in ([] if pt is None or pt.empty else pt.itertuples()):
        # the sampled runs' p-value is the headline (greedy pairs are identical when lossless)
        if r.mode == "sampled" or f"toolsuite/mcnemar_p.{r.drafter}" not in out:
            out[f"toolsuite/mcnemar_p.{r.drafter}"] = (r.mcnemar_p, None, None)
    return out
