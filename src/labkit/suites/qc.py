"""Tool-suite quality control: the same suite with speculation off and on.

"Speed features that quietly wreck behaviour are not speed features." Greedy runs
must agree token for token; any task whose output differs is listed with the position
and logit gap of its first divergence. Sampled runs (seeded, temperature > 0) use the
loop's distribution-preserving speculative sampling; the noise band is the spread of
the off runs' suite scores, and the verdict is "within noise" or the regression in
points.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable

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
    stops = engine.tokens_containing(toolsuite.STOP)
    rows, scores, records, prompts = [], [], {}, {}
    all_ids = [engine.tokenize(toolsuite.build_prompt(task)) for task in tasks]
    keep = _common_prefix(all_ids)  # the few-shot preamble every task shares
    for i, (task, ids) in enumerate(zip(tasks, all_ids)):
        recs = run(engine, ids, drafter=drafter, k=k, max_tokens=max_tokens, temperature=temperature,
                   seed=seed + i, gate=make_gate() if (make_gate and k > 0) else None, stop_tokens=stops,
                   keep_prefix=keep)
        text = engine.detokenize(tokens_of(recs))
        sc = toolsuite.score_task(task, text)
        s = summarize(recs)
        scores.append(sc)
        records[task.id], prompts[task.id] = recs, ids
        rows.append({"task": task.id, "category": task.category, "correct": sc.correct, "parsed": sc.parsed,
                     "valid": sc.valid, "right_tool": sc.right_tool, "right_args": sc.right_args,
                     "error": sc.error, "output": text, "tokens": s.tokens, "decode_tok_s": s.decode_tok_s,
                     "acceptance": s.acceptance})
    return {"summary": toolsuite.summarize(scores), "rows": pd.DataFrame(rows), "records": records,
            "prompts": prompts}


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


def verdict(off_scores: list[float], on_scores: list[float]) -> dict:
    """Within the off runs' noise band, or the regression in points (percentage points)."""
    lo, hi = min(off_scores), max(off_scores)
    med = float(np.median(on_scores))
    if med >= lo:
        text = f"within noise: on {med:.1%} vs off band {lo:.1%}-{hi:.1%}"
        regression = 0.0
    else:
        regression = 100 * (lo - med)
        text = f"regression: on {med:.1%} is {regression:.1f} points below the off band {lo:.1%}-{hi:.1%}"
    return {"verdict": text, "within_noise": med >= lo, "regression_points": regression,
            "off_band": [lo, hi], "on_median": med, "on_range": [min(on_scores), max(on_scores)]}


def control(engine, tasks, *, drafters: dict, k: int, runs: int = 3, temperature: float = 0.7, seed: int = 0,
            progress: Callable | None = None, on_arm: Callable | None = None, skip: dict | None = None) -> dict:
    """Speculation off vs on for each drafter: greedy once each (deterministic), sampled ``runs`` times.

    One arm is one block (the whole task set, one spec setting, drafter, temperature and
    run), keyed ``taskset~T~off|on~drafter~round~k``; ``on_arm`` and ``skip`` journal and
    resume blocks (see ``measure.arms``), each with its per-task rows and step records.
    """
    say = progress or (lambda _m: None)
    taskset = "ts" + hashlib.sha256(",".join(t.id for t in tasks).encode()).hexdigest()[:8]
    blocks = ([(0.0, None, 0)] + [(0.0, n, 0) for n in drafters] + [(temperature, None, r) for r in range(runs)]
              + [(temperature, n, r) for n in drafters for r in range(runs)])

    def block_key(temp, name, r):
        return arms.key(taskset, f"T{temp:g}", "on" if name else "off", name or "none", f"r{r}", f"k{k if name else 0}")

    arms.plan(on_arm, [block_key(*b) for b in blocks])

    def block(temp, name, r):
        """The suite run of one block and its scores-table row (measured, or restored)."""
        bkey = block_key(temp, name, r)
        got = arms.restored(skip, bkey)
        if got is not None:
            row, recs = got
            res = {"summary": row.pop("_summary"), "rows": pd.DataFrame(row.pop("_tasks")), "records": recs,
                   "prompts": {t.id: engine.tokenize(toolsuite.build_prompt(t)) for t in tasks}}
            return res, row
        spec = f"speculation on ({name}, k={k})" if name else "speculation off"
        say(f"tool suite: greedy, {spec}" if temp == 0 else f"tool suite: T={temp}, {spec}, run {r + 1}/{runs}")
        res = run_suite(engine, tasks, drafter=drafters[name] if name else None, k=k if name else 0,
                        temperature=temp, seed=seed if temp == 0 else seed + 1000 * (r + 1))
        row = {"spec": "on" if name else "off", "drafter": name or "none", "temperature": temp, "run": r,
               "score": res["summary"]["score"]}
        if name and temp == 0:
            acc = res["rows"]["acceptance"]
            row["acceptance"] = float(acc.dropna().median()) if acc.notna().any() else None
        row.update(_cats(res))
        row["decode_tok_s"] = float(res["rows"]["decode_tok_s"].median())
        arm_row = {**row, "_tasks": res["rows"].to_dict("records"), "_summary": res["summary"]}
        arms.finished(on_arm, bkey, arm_row, res["records"])
        row.update({c: v for c, v in arm_row.items() if c not in row and not c.startswith("_")})
        return res, row

    table, divs, verdicts = [], [], {}
    off, row = block(0.0, None, 0)
    table.append(row)
    for name in drafters:
        on, row = block(0.0, name, 0)
        table.append(row)
        dv = greedy_divergences(engine, off, on)
        dv.insert(0, "drafter", name)
        divs.append(dv)
    sampled_off = []
    for r in range(runs):
        res, row = block(temperature, None, r)
        sampled_off.append(res["summary"]["score"])
        table.append(row)
    for name in drafters:
        on_scores = []
        for r in range(runs):
            res, row = block(temperature, name, r)
            on_scores.append(res["summary"]["score"])
            table.append(row)
        verdicts[name] = verdict(sampled_off, on_scores)
    return {"scores": pd.DataFrame(table), "divergences": pd.concat(divs, ignore_index=True) if divs else
            pd.DataFrame(), "verdicts": verdicts, "greedy_off": off["summary"], "k": k,
            "temperature": temperature, "runs": runs, "tasks": len(tasks)}


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
        rows.append({"drafter": name, "k": res["k"], "greedy_off": off_g, "greedy_on": on_g,
                     "greedy_tasks_differing": ndiv, "sampled_T": res["temperature"],
                     "off_band_low": v["off_band"][0], "off_band_high": v["off_band"][1],
                     "on_median": v["on_median"], "verdict": v["verdict"]})
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
    return out
