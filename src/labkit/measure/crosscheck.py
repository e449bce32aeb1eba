"""labkit's timings checked against llama.cpp's own tools, on the same build and model.

``llama-bench`` (``-p 1,..,8 -n 0 -d kv_depth``: prompt processing of m tokens at that KV
depth; ``-p 0 -n N``: the plain step) and labkit's own decode of m rows at the same depth
are measured round by round, the two arms alternating which goes first (drift does not
favour either). Both come from one build (``engines.native``: the ``libllama.so`` this
process loaded is the file llama-bench links).

Like for like: llama-bench's prompt batch asks for the logits of its last row only, so
labkit is timed both ways: m rows with one logit row (the same work: this is the check)
and m rows with every logit row (what a speculative verify needs: the difference is the
output head's cost per extra row, a finding, not an error).
"""

from __future__ import annotations

import json
import subprocess
from collections.abc import Callable, Sequence
from pathlib import Path

import numpy as np
import pandas as pd

from labkit.errors import LabkitError
from labkit.measure.verify_cost import _time_decode, context_ids

Progress = Callable[[str], None] | None


def bench_args(exe: str | Path, model: str | Path, *, m_values: Sequence[int], kv_depth: int, threads: int,
               reps: int, n_gen: int) -> list[str]:
    """The llama-bench command: every m as prompt processing at ``kv_depth``, and ``n_gen``
    generated tokens at that depth (the plain step), ``reps`` repetitions each, JSON out."""
    return [str(exe), "-m", str(model), "-p", ",".join(str(m) for m in m_values), "-n", str(n_gen),
            "-d", str(kv_depth), "-t", str(threads), "-r", str(reps), "-o", "json", "--progress"]


def parse_bench(text: str) -> pd.DataFrame:
    """llama-bench's JSON (a list of tests) as one row per sample: test ("pp" or "tg"), m
    (prompt tokens; 1 for tg), depth, ms (per pp batch; per token for tg)."""
    try:
        tests = json.loads(text)
    except ValueError as e:
        raise LabkitError(f"llama-bench printed no JSON ({e}); its output began: {text[:200]!r}",
                          "run the command from the table's provenance by hand to see llama-bench's error") from e
    out = []
    for t in tests:
        n_p, n_g = int(t["n_prompt"]), int(t["n_gen"])
        for ns in t["samples_ns"]:
            if n_p > 0 and n_g == 0:
                out.append({"test": "pp", "m": n_p, "depth": int(t.get("n_depth", 0)), "ms": ns / 1e6})
            elif n_g > 0 and n_p == 0:
                out.append({"test": "tg", "m": 1, "depth": int(t.get("n_depth", 0)), "ms": ns / 1e6 / n_g})
    return pd.DataFrame(out, columns=["test", "m", "depth", "ms"])


def _labkit_round(engine, rows: list[int], m_values: Sequence[int], kv_depth: int, reps: int, rng) -> list[dict]:
    """``reps`` timings of m rows at ``kv_depth`` per m, with one logit row and with m."""
    out = []
    for _ in range(reps):
        for m in rng.permutation(list(m_values)):
            for all_logits in rng.permutation([False, True]):
                ms = _time_decode(engine, rows[: int(m)], kv_depth, all_logits=bool(all_logits))
                out.append({"m": int(m), "logit_rows": int(m) if all_logits else 1, "ms": ms})
    return out


def run(engine, exe: str | Path, *, m_values: Sequence[int] = tuple(range(1, 9)), kv_depth: int = 200,
        rounds: int = 3, reps: int = 5, n_gen: int = 16, seed: int = 0, progress: Progress = None,
        runner: Callable[[list[str]], str] | None = None) -> dict:
    """``rounds`` rounds, each: labkit's decode of every m (``reps`` times, both logit
    settings) and one llama-bench call (``reps`` repetitions), first arm alternating.

    Returns ``samples`` (source "labkit" | "llama-bench", test, m, logit_rows, round, ms),
    the llama-bench ``command`` and its ``version`` line."""
    if not Path(exe).is_file():
        raise LabkitError(f"llama-bench is not at {exe}", "run `make setup` (one llama.cpp build gives the tools)")
    m_values = sorted(set(int(m) for m in m_values))
    model = engine.model_path
    cmd = bench_args(exe, model, m_values=m_values, kv_depth=kv_depth, threads=engine.n_threads, reps=reps,
                     n_gen=n_gen)
    runner = runner or _run_bench
    ctx = context_ids(engine, kv_depth, seed=seed)
    rows = context_ids(engine, max(m_values), seed=seed + 1)
    engine.check_fits(kv_depth + max(m_values), what=f"kv_depth {kv_depth} + m {max(m_values)}")
    rng = np.random.default_rng(seed)
    samples = []
    for r in range(rounds):
        order = ("labkit", "llama-bench") if r % 2 == 0 else ("llama-bench", "labkit")
        for arm in order:
            if arm == "labkit":
                engine.rollback(0)
                engine.decode(ctx, all_logits=False)
                for m in m_values:  # warm-up, as llama-bench's own
                    _time_decode(engine, rows[:m], kv_depth)
                for s in _labkit_round(engine, rows, m_values, kv_depth, reps, rng):
                    samples.append({"source": "labkit", "test": "pp", "round": r, **s})
                engine.rollback(0)
            else:
                b = parse_bench(runner(cmd))
                for x in b.to_dict("records"):
                    samples.append({"source": "llama-bench", "test": x["test"], "m": x["m"], "logit_rows": 1,
                                    "round": r, "ms": x["ms"]})
        if progress:
            progress(f"cross-check round {r + 1}/{rounds} ({' then '.join(order)})")
    return {"samples": pd.DataFrame(samples), "command": cmd, "rounds": rounds, "reps": reps, "kv_depth": kv_depth,
            "n_gen": n_gen, "order": "rounds alternate which arm goes first; labkit's m and logit settings "
                                     "in a fresh random order each repetition"}


def _run_bench(cmd: list[str]) -> str:
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    if p.returncode != 0:
        raise LabkitError(f"llama-bench exited {p.returncode}: {p.stderr.strip()[-400:]}",
                          f"run it by hand: {' '.join(cmd)}")
    return p.stdout


def for_engine(engine, *, m_values: Sequence[int], kv_depth: int, rounds: int, seed: int = 0,
               progress: Progress = None, **kw) -> dict:
    """The cross-check for 01's engine, or ``skipped`` with the reason (an engine llama-bench
    cannot run: MLX). llama-bench comes from this machine's one llama.cpp build (built now,
    that target alone, if an older cache lacks it); ``one_build`` says whether the engine's
    libllama is that build's file (``engines.native.loaded``)."""
    from labkit.engines import native

    desc = engine.describe()
    if desc.get("engine") != "llama.cpp":
        return {"skipped": f"llama-bench cross-check needs a llama.cpp engine (this recipe runs "
                           f"{desc.get('engine')}): skipped", "samples": None}
    build = native.build(progress=progress)
    exe = Path(build["bin"]) / "llama-bench"
    res = run(engine, exe, m_values=m_values, kv_depth=kv_depth, rounds=rounds, seed=seed, progress=progress, **kw)
    lib = desc.get("build", {})
    res["one_build"] = lib.get("one_build")
    res["one_build_why"] = lib.get("one_build_why")
    res["build"] = {k: build.get(k) for k in ("dir", "llama_cpp_commit", "cmake_args")}
    res["llama_bench_sha256"] = build.get("sha256", {}).get("llama-bench")
    res["skipped"] = None
    return res


def tags(table: pd.DataFrame | None, res: dict) -> dict:
    """The run tags: crosscheck.verdict, crosscheck.line, crosscheck.one_build, crosscheck.command."""
    from labkit.analysis import crosscheck as xc

    if res.get("skipped"):
        return {"crosscheck.verdict": "skipped", "crosscheck.line": res["skipped"]}
    s = xc.summary(table)
    line = s["line"] + ("" if res.get("one_build") else f" (NOT one build: {res.get('one_build_why')})")
    return {"crosscheck.verdict": s["verdict"], "crosscheck.line": line,
            "crosscheck.one_build": str(res.get("one_build")), "crosscheck.command": " ".join(res["command"])}


def batched_args(exe: str | Path, model: str | Path, *, pp: int, tg: int, npl: Sequence[int], threads: int,
                 kv_unified: bool = True) -> list[str]:
    """llama-batched-bench: ``pl`` streams of ``pp`` prompt and ``tg`` generated tokens each,
    labkit's KV layout (full SWA cache, one unified buffer), JSON lines out."""
    n_ctx = max(npl) * (pp + tg) + 64
    return [str(exe), "-m", str(model), "-c", str(n_ctx), "-b", "2048", "-ub", "512", "-npp", str(pp),
            "-ntg", str(tg), "-npl", ",".join(str(c) for c in npl), "-t", str(threads), "-tb", str(threads),
            "--swa-full", *(["-kvu"] if kv_unified else []), "--output-format", "jsonl"]


def parse_batched(text: str) -> pd.DataFrame:
    """batched-bench's JSON lines: pl (streams), pp, tg, speed_tg (aggregate generated tok/s,
    prefill left out), speed_pp."""
    rows = []
    for line in text.splitlines():
        line = line.strip()
        if line.startswith("{") and '"speed_tg"' in line:
            d = json.loads(line)
            rows.append({k: d[k] for k in ("pl", "pp", "tg", "speed_tg", "speed_pp", "t_tg")})
    if not rows:
        raise LabkitError(f"llama-batched-bench printed no result line; its output began: {text[:200]!r}",
                          "run the command from the table's provenance by hand to see its error")
    return pd.DataFrame(rows)


def batched(exe: str | Path, model: str | Path, *, pp: int, tg: int, npl: Sequence[int], threads: int,
            rounds: int, progress: Progress = None, runner: Callable[[list[str]], str] | None = None) -> dict:
    """``rounds`` runs of llama-batched-bench (one row per round and pl)."""
    cmd = batched_args(exe, model, pp=pp, tg=tg, npl=npl, threads=threads)
    runner = runner or _run_bench
    out = []
    for r in range(rounds):
        out.append(parse_batched(runner(cmd)).assign(round=r))
        if progress:
            progress(f"llama-batched-bench round {r + 1}/{rounds}")
    return {"rows": pd.concat(out, ignore_index=True), "command": cmd}


class BatchedRounds:
    """07's plain arms against llama-batched-bench at c = 1..4 (the recipe's c values up to 4),
    interleaved: ``bench_concurrency(..., after_round=this)`` calls it after each of labkit's
    rounds, and it runs llama-batched-bench once (every c in one call) with that round's index,
    so a drift of the box lands on both sides of a pair. ``result()`` is what ``batched``
    returns, plus the order."""

    def __init__(self, model: str | Path, *, cs: Sequence[int], prompts: Sequence[Sequence[int]], max_tokens: int,
                 threads: int, progress: Progress = None, runner: Callable[[list[str]], str] | None = None,
                 exe: str | Path | None = None):
        if exe is None:
            from labkit.engines import native

            exe = Path(native.build(progress=progress)["bin"]) / "llama-batched-bench"
        pp = int(np.median([len(p) for p in prompts]))
        self.cmd = batched_args(exe, model, pp=pp, tg=max_tokens, npl=[c for c in cs if c <= 4], threads=threads)
        self.runner, self.progress, self.rows = runner or _run_bench, progress, []

    def __call__(self, r: int) -> None:
        self.rows.append(parse_batched(self.runner(self.cmd)).assign(round=r))
        if self.progress:
            self.progress(f"llama-batched-bench after labkit's round {r + 1}")

    def result(self) -> dict:
        if not self.rows:
            raise LabkitError("llama-batched-bench ran no round", "pass it to bench_concurrency(after_round=...)")
        return {"rows": pd.concat(self.rows, ignore_index=True), "command": self.cmd,
                "order": "interleaved: one llama-batched-bench call after each of labkit's rounds"}
