"""The concurrency re-bench: speculation priced at the concurrency you serve.

For every c (streams decoded together) and k (0 = plain continuous batching), a run
sends the same queue of requests through labkit's multi-slot loop
(``decoding.multislot``) on c slots, closed loop: a slot takes the next request as soon
as its stream ends. All (c, k) arms are interleaved round by round with the one policy
(``measure.order``), so drift on a shared box shows up as spread, not as a trend in c.

Per run: aggregate tok/s (all tokens / wall time from the first admission to the last
token), per-stream tok/s (each stream's tokens after its first / its time from first to
last token, median over streams: what one user sees), TTFT and TTLT per request (from
its admission; p50, p95), acceptance (accepted / drafted, pooled), rows per shared
decode, and each shared decode's (rows, ms) for the batch cost fit. Per (c, k): median
and range over runs, and the speedup of k vs k = 0 at the same c.

Lossless per stream: each greedy stream's tokens are compared with the plain
single-stream output of its prompt on the same engine (``decoding.loop``, sequence 0);
a divergence is explained by ``analysis.lossless.divergence_report`` (a near-tie from
batched kernels is lossless, anything else is not).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from contextlib import closing

import numpy as np

from labkit.analysis.decide import AA
from labkit.analysis.lossless import DEFAULT_NEAR_TIE, divergence_report
from labkit.analysis.stats import spread
from labkit.decoding.drafters.base import Drafter
from labkit.decoding.loop import run
from labkit.decoding.multislot import Request, StreamRecord, by_stream, run_many
from labkit.errors import LabkitError
from labkit.measure import order
from labkit.measure.verify_cost import Progress

DEFAULT_C = (1, 2, 4, 8)
AA_ARM = -1  # the A/A control's key among the (c, k) arms: a plain arm measured a second time
POLICY_ARM = -2  # the draft length policy's key among the (c, k) arms (``policy=``)


def sum_per_pos(lists: Sequence[Sequence[int]]) -> list[int]:
    """Per-position counts summed over runs (lists of unequal length padded with 0)."""
    n = max((len(x) for x in lists), default=0)
    return [int(sum(x[i] for x in lists if i < len(x))) for i in range(n)]


def pct(values: Sequence[float], q: float) -> float | None:
    v = [x for x in values if x is not None]
    return float(np.percentile(v, q)) if v else None


def run_stats(records: Sequence[StreamRecord]) -> dict:
    """The numbers of one multi-slot run (records of all its streams)."""
    streams = by_stream(records)
    wall_ms = max(r.t_run_ms for r in records)
    tokens = sum(len(r.tokens) for r in records)
    ttft, ttlt, per_stream = [], [], []
    for recs in streams.values():
        n = sum(len(r.tokens) for r in recs)
        first, last = recs[0].t_ms, recs[-1].t_ms
        ttft.append(first)
        ttlt.append(last)
        if n > 1 and last > first:
            per_stream.append(1e3 * (n - 1) / (last - first))
    dec = [r for r in records if r.batch_step >= 0]
    drafted = sum(r.drafted for r in dec)
    accepted = sum(r.accepted for r in dec)
    # llama-server's per-position counters, counted the same way: over the steps that verified
    # a draft, how many accepted more than i drafted tokens
    spec = [r for r in dec if r.drafted > 0]
    per_pos = [sum(1 for r in spec if r.accepted > i) for i in range(max((r.drafted for r in spec), default=0))]
    batches: dict[int, StreamRecord] = {}
    draft_ms: dict[int, float] = {}
    accept_ms: dict[int, float] = {}
    for r in dec:
        batches.setdefault(r.batch_step, r)
        draft_ms[r.batch_step] = draft_ms.get(r.batch_step, 0.0) + r.draft_ms
        accept_ms[r.batch_step] = accept_ms.get(r.batch_step, 0.0) + r.accept_ms
    steps = [{"rows": b.batch_rows, "streams": b.batch_streams, "verify_ms": b.verify_ms,
              "draft_ms": draft_ms[i], "accept_ms": accept_ms[i]} for i, b in sorted(batches.items())]
    decode_ms = sum(s["verify_ms"] + s["draft_ms"] + s["accept_ms"] for s in steps)
    dec_tokens = sum(len(r.tokens) for r in dec)
    return {
        "requests": len(streams),
        "tokens": tokens,
        "wall_ms": wall_ms,
        "agg_tok_s": 1e3 * tokens / wall_ms if wall_ms > 0 else None,
        "agg_decode_tok_s": 1e3 * dec_tokens / decode_ms if decode_ms > 0 else None,
        "per_stream_tok_s": float(np.median(per_stream)) if per_stream else None,
        "ttft_ms": ttft,
        "ttlt_ms": ttlt,
        "drafted": drafted,
        "accepted": accepted,
        "acceptance": accepted / drafted if drafted else None,
        "draft_steps": len(spec),
        "accepted_per_pos": per_pos,
        "stream_steps": len(dec),
        "tokens_per_stream_step": dec_tokens / len(dec) if dec else None,
        "drafted_per_stream_step": drafted / len(dec) if dec else None,
        "overhead_ms_per_stream_step": (sum(s["draft_ms"] + s["accept_ms"] for s in steps) / len(dec)) if dec else None,
        "batch_steps": steps,
        "rows_per_step": float(np.mean([s["rows"] for s in steps])) if steps else None,
        "streams_per_step": float(np.mean([s["streams"] for s in steps])) if steps else None,
    }


def _vocab(recipe):
    """The recipe model's vocabulary (``vocab_only``: no weights), closed on leaving ``with``."""
    from labkit.artifacts.loader import resolve_model
    from labkit.engines.llamacpp import LlamaVocab

    return closing(LlamaVocab.load(resolve_model(recipe).path))


def has_tokenizer(recipe) -> bool:
    """Whether the recipe's model has a vocabulary to tokenize text (SYNTHETIC cost models have none)."""
    with _vocab(recipe) as vocab:
        return bool(vocab.has_tokenizer)


def tokenize(recipe, texts: Sequence[str]) -> list[list[int]]:
    """Token ids of ``texts`` with the recipe model's own vocabulary (no weights loaded)."""
    with _vocab(recipe) as vocab:
        return [vocab.tokenize(t) for t in texts]


def n_ctx_per_seq(prompts: Sequence[Sequence[int]], *, max_tokens: int, ks: Sequence[int], n_ctx: int) -> int:
    """Positions one sequence needs (longest prompt + max_tokens + k), rounded up to 256,
    so c sequences cost c times that much KV cache, not c times the recipe's n_ctx."""
    need = max(len(p) for p in prompts) + max_tokens + max(ks) + 8
    per = 256 * math.ceil(need / 256)
    if per > n_ctx:
        raise LabkitError(f"a stream needs {need} positions but the recipe's n_ctx is {n_ctx}",
                          "lower max_tokens or raise n_ctx in the recipe")
    return per


def drafter_factory(recipe, engine, name: str = "ngram") -> Callable[[], Drafter]:
    """One new drafter per slot, from the registry (drafters that need the target's MTP
    context cannot share one context between streams)."""
    from labkit.config import runtime
    from labkit.decoding import drafters

    if drafters.get(name).mtp_context:
        raise LabkitError(f"drafter {name!r} needs the target's own MTP context, one per stream",
                          "re-bench concurrency with --drafter ngram")
    return lambda: runtime.make_drafter(name, recipe, engine)


def make_requests(prompts: Sequence[Sequence[int]], n: int, *, max_tokens: int,
                  stop_tokens: frozenset[int] = frozenset()) -> list[Request]:
    """``n`` requests cycling through ``prompts`` (token ids), the same list for every c."""
    if not prompts:
        raise LabkitError("no prompts for the concurrency run", "give a workload with at least one prompt")
    return [Request(prompt=list(prompts[i % len(prompts)]), max_tokens=max_tokens, stop_tokens=stop_tokens,
                    id=str(i % len(prompts))) for i in range(n)]


def bench_concurrency(
    engine,
    prompts: Sequence[Sequence[int]],
    *,
    cs: Sequence[int] = DEFAULT_C,
    ks: Sequence[int] = (0, 3),
    make_drafter: Callable[[], Drafter] | None = None,
    drafter_name: str = "ngram",
    runs: int = 1,
    n_requests: int | None = None,
    max_tokens: int = 64,
    seed: int = 0,
    interleave: str = order.DEFAULT_POLICY,
    near_tie: float = DEFAULT_NEAR_TIE,
    check_lossless: bool = True,
    progress: Progress = None,
    control: bool = False,
    policy: tuple[str, Callable[[], object], int] | None = None,
    after_round: Callable[[int], None] | None = None,
) -> dict:
    """Every (c, k) arm, ``runs`` interleaved rounds; returns JSON-ready results.

    ``n_requests`` (default: max(c), at least the number of prompts) requests go through
    each run, the same list for every c. Greedy only (temperature 0): the lossless check
    needs it, and sampling at c > 1 adds nothing to the cost question. ``control`` adds the
    A/A arm at every c (a second plain arm, drafter "aa", interleaved like the others).
    ``policy`` = (name, factory, k_max) adds the draft length policy's arm at every c
    (drafter "<drafter>+<name>", k = k_max, interleaved like the others): one policy object
    per c for all its rounds, so it learns online across rounds as a server would, and
    chooses every stream's j together, pricing the shared decode (``decoding.multislot``).
    ``after_round(r)`` runs after round r's arms (an outside tool's round, interleaved with
    labkit's: ``measure.crosscheck.BatchedRounds``).
    """
    cs, ks = sorted(set(cs)), sorted(set(ks))
    if not cs or min(cs) < 1:
        raise LabkitError(f"concurrency values {cs}", "use c >= 1, e.g. 1,2,3,4")
    if any(k < 0 for k in ks) or not ks:
        raise LabkitError(f"k values {ks}", "use k >= 0 (0 = plain), e.g. 0,3")
    if any(k > 0 for k in ks) and make_drafter is None:
        raise LabkitError("k > 0 needs a drafter", "pass --drafter ngram")
    n = n_requests or max(max(cs), len(prompts))
    reqs = make_requests(prompts, n, max_tokens=max_tokens)
    # the plain single-stream reference for each distinct prompt (also the warm-up)
    engine.seq_clear()
    ref = {}
    if check_lossless:
        for i, p in enumerate(prompts[: len(reqs)]):
            ref[i] = run(engine, list(p), max_tokens=max_tokens)
        if progress:
            progress(f"single-stream references: {len(ref)} prompts")
    run_many(engine, reqs[: max(cs)], c=max(cs), k=0, stop_at_eog=True)  # warm-up: every slot once, not recorded
    if policy is not None and make_drafter is None:
        raise LabkitError("a draft length policy arm needs a drafter", "pass make_drafter (e.g. --drafter ngram)")
    arms = ([(c, k) for c in cs for k in ks] + ([(c, AA_ARM) for c in cs] if control and 0 in ks else [])
            + ([(c, POLICY_ARM) for c in cs] if policy is not None else []))
    pols: dict[int, object] = {}  # c -> the policy arm's one policy object
    what = {AA_ARM: "A/A plain", **({POLICY_ARM: f"{policy[0]} (k_max {policy[2]})"} if policy else {})}
    results: dict[tuple, list] = {a: [] for a in arms}
    lossless: dict[tuple, list] = {a: [] for a in arms}
    for r in range(runs):
        for c, k in order.arm_order(arms, r, policy=interleave, seed=seed):
            if k == POLICY_ARM:
                if c not in pols:  # made once per c: it keeps what it learned across rounds
                    pols[c] = policy[1]()
                pol = pols[c]
                recs = run_many(engine, reqs, c=c, k=policy[2], make_drafter=make_drafter, seed=seed, policy=pol)
            else:
                kk = 0 if k == AA_ARM else k
                recs = run_many(engine, reqs, c=c, k=kk, make_drafter=make_drafter if kk else None, seed=seed)
            results[(c, k)].append({**run_stats(recs), **(_policy_stats(recs) if k == POLICY_ARM else {})})
            if check_lossless:
                lossless[(c, k)].extend(_lossless(engine, reqs, recs, ref, near_tie=near_tie))
            if progress:
                s = results[(c, k)][-1]
                progress(f"round {r + 1}/{runs} c={c} {what.get(k, f'k={k}')}: "
                         f"{s['agg_tok_s']:.1f} tok/s aggregate, "
                         f"{s['per_stream_tok_s'] or 0:.1f} per stream")
        if after_round is not None:
            engine.seq_clear()
            after_round(r)
    rows = [_arm_row(c, k, results[(c, k)], lossless[(c, k)] if check_lossless else None, drafter_name, policy)
            for c, k in arms]
    base = {c: next(r for r in rows if r["c"] == c and r["k"] == min(ks)) for c in cs}
    for (c, k), row in zip(arms, rows, strict=True):
        b = base[row["c"]]
        row["speedup"] = row["agg_tok_s"] / b["agg_tok_s"] if min(ks) == 0 and b["agg_tok_s"] else None
        pairs = [s["agg_tok_s"] / p["agg_tok_s"] for s, p in
                 zip(results[(c, k)], results[(c, min(ks))], strict=True)]
        row["speedup_pairs"] = spread(pairs) if min(ks) == 0 else None
    return {
        "kind": "concurrency",
        "engine": "labkit",
        "cs": cs,
        "ks": ks,
        "drafter": drafter_name,
        "runs": runs,
        "requests": n,
        "max_tokens": max_tokens,
        "interleave": order.describe(interleave, seed),
        "prompt_tokens": [len(p) for p in prompts],
        "rows": rows,
        "reference": {i: [t for rec in recs for t in rec.tokens] for i, recs in ref.items()},
        "policy": None if policy is None else {"name": policy[0], "k_max": policy[2],
                                               "describe": {c: p.describe() for c, p in pols.items()}},
        "batch_steps": [{"c": c, "k": policy[2] if k == POLICY_ARM else max(k, 0), **s}
                        for (c, k), res in results.items() for x in res for s in x["batch_steps"]],
    }


def server_lossless(engine, prompts: Sequence[Sequence[int]], reference: dict, serve: dict, *,
                    near_tie: float = DEFAULT_NEAR_TIE) -> dict:
    """llama-server's greedy outputs vs labkit's single-stream plain output of the same prompt.

    Sets each server row's ``lossless`` (and ``identical``, ``divergences``) in place and
    returns ``serve``. The server does not stream the end-of-generation token that labkit
    emits, so a reference ending in one matches the server's output without it.
    """
    ref = {int(i): list(t) for i, t in reference.items()}
    for row in serve["rows"]:
        reports = []
        for out in serve["outputs"][f"c{row['c']}_k{row['k']}"]:
            for req, toks in out.items():
                p = serve["request_prompts"][int(req)]
                if p not in ref:
                    continue
                want = ref[p]
                if len(want) == len(toks) + 1 and engine.is_eog(want[-1]) and want[:-1] == list(toks):
                    toks = want
                rep = divergence_report(engine, list(prompts[p]), want, list(toks), near_tie=near_tie)
                reports.append({"request": int(req), **rep})
        row["lossless"] = all(x["lossless"] for x in reports) if reports else None
        row["identical"] = all(x["identical"] for x in reports) if reports else None
        row["divergences"] = [{"request": x["request"], **x["divergence"]} for x in reports if x["divergence"]]
    engine.seq_clear()
    return serve


def _lossless(engine, reqs, recs, ref, *, near_tie) -> list[dict]:
    """Per stream: identical to its prompt's single-stream plain output, or why not."""
    out = []
    for i, srecs in by_stream(recs).items():
        p = int(reqs[i].id)
        if p not in ref:
            continue
        rep = divergence_report(engine, reqs[i].prompt, ref[p], srecs, near_tie=near_tie)
        out.append({"stream": i, **rep})
    engine.seq_clear()
    return out


def _policy_stats(recs) -> dict:
    """The policy arm's choices in one run: how often each j was chosen over stream steps."""
    js = [r.policy_j for r in recs if r.policy_j is not None]
    return {"policy_j": {int(j): js.count(j) for j in sorted(set(js))}}


def _arm_row(c: int, k: int, res: list[dict], loss, drafter: str, policy) -> dict:
    """The row of one (c, k) arm; the A/A and policy arms under their own drafter names."""
    if k == AA_ARM:
        return _row(c, 0, res, loss, AA)
    if k == POLICY_ARM:
        row = _row(c, policy[2], res, loss, f"{drafter}+{policy[0]}")
        hist: dict[int, int] = {}
        for x in res:
            for j, n in x.get("policy_j", {}).items():
                hist[j] = hist.get(j, 0) + n
        total = sum(hist.values())
        return {**row, "policy": policy[0], "policy_j": hist,
                "policy_mean_j": sum(j * n for j, n in hist.items()) / total if total else None,
                "policy_drafting_share": sum(n for j, n in hist.items() if j) / total if total else None}
    return _row(c, k, res, loss, drafter)


def _row(c: int, k: int, res: list[dict], loss: list[dict] | None, drafter: str) -> dict:
    agg = spread([x["agg_tok_s"] for x in res])
    per = spread([x["per_stream_tok_s"] for x in res])
    ttft = [t for x in res for t in x["ttft_ms"]]
    ttlt = [t for x in res for t in x["ttlt_ms"]]
    drafted, accepted = sum(x["drafted"] for x in res), sum(x["accepted"] for x in res)
    steps = [s for x in res for s in x["batch_steps"]]
    dec = sum(x["stream_steps"] for x in res)
    return {
        "c": c, "k": k, "drafter": drafter if (k or drafter == AA) else "none", "engine": "labkit",
        "agg_tok_s": agg["median"], "agg_tok_s_min": agg["min"], "agg_tok_s_max": agg["max"],
        "agg_runs": agg["values"],
        "agg_decode_tok_s": spread([x["agg_decode_tok_s"] for x in res])["median"],
        "agg_decode_runs": [x["agg_decode_tok_s"] for x in res],
        "draft_steps": sum(x.get("draft_steps", 0) for x in res),
        "accepted_per_pos": sum_per_pos([x.get("accepted_per_pos") or [] for x in res]),
        "per_stream_tok_s": per["median"], "per_stream_tok_s_min": per["min"], "per_stream_tok_s_max": per["max"],
        "ttft_p50_ms": pct(ttft, 50), "ttft_p95_ms": pct(ttft, 95),
        "ttlt_p50_ms": pct(ttlt, 50), "ttlt_p95_ms": pct(ttlt, 95),
        "acceptance": accepted / drafted if drafted else None,
        "rows_per_step": float(np.mean([s["rows"] for s in steps])) if steps else None,
        "streams_per_step": float(np.mean([s["streams"] for s in steps])) if steps else None,
        "tokens_per_stream_step": sum(x["tokens_per_stream_step"] * x["stream_steps"] for x in res) / dec if dec else None,
        "drafted_per_stream_step": drafted / dec if dec else None,
        "overhead_ms_per_stream_step": (sum(x["overhead_ms_per_stream_step"] * x["stream_steps"] for x in res) / dec
                                        if dec else None),
        "runs": len(res),
        "lossless": all(x["lossless"] for x in loss) if loss else None,
        "identical": all(x["identical"] for x in loss) if loss else None,
        "divergences": [{"stream": x["stream"], **x["divergence"]} for x in (loss or []) if x["divergence"]],
    }
