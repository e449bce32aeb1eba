"""Replay: the exact accept pattern of greedy speculation at any k, from one plain run.

Under greedy decoding with a deterministic drafter (n-gram lookup, a greedy draft
model) speculative output *is* plain output, token for token (the lossless invariant).
So every step of a speculative run at draft length k can be replayed without the
target: the step starts from the history (prompt + plain tokens emitted so far), asks
the drafter for k tokens, and the accepted prefix is the part that matches the plain
stream; the step then emits the accepted drafts plus one target token, and the next
proposal starts from that new history.

What is subtle, and mirrored from ``decoding.loop.generate`` exactly:
- the drafter is made fresh per (prompt, k) and ``begin(prompt)`` is called, so an
  incremental drafter (NgramDrafter's index, a draft model's KV cache) walks through
  the same states, in the same order, as in the real loop;
- the first token comes from the prefill, so stepping starts at emitted = 1;
- a draft never asks for more than ``max_tokens - emitted`` tokens;
- when the plain run ended on a stop token, a draft that matched through that token
  would be checked further by the real loop against positions the plain run never
  produced: the emitted tokens are still exact, the accepted count is a lower bound
  (``exact = False``).

Pure: it never touches an engine. It takes the plain tokens and a factory that makes
the drafter (which may itself own a draft engine); draft time is measured here with
``perf_counter`` because it is the real draft computation of that step.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence

import numpy as np
import pandas as pd


def replay(prompt: Sequence[int], plain: Sequence[int], drafter, k: int, *, max_tokens: int,
           policy=None) -> list[dict]:
    """One record per decode step of a greedy speculative run at draft length ``k``.

    ``plain``: the plain greedy output (every emitted token, the prefill's first one
    included); ``drafter``: a fresh drafter, not yet begun. Records carry step, k (asked
    this step), drafted, accepted, outcomes (1/0/-1 per drafted position, as the loop
    writes them), draft, tokens (emitted), draft_ms and exact.

    ``policy`` (``decoding.policy``, k = its k_max): each step's draft is cut to the j it
    chooses from the drafter's evidence, and it learns from the replayed outcomes, as in
    the loop; records add policy_j, policy_pred and policy_bins. It keeps what it learned
    across calls (pass the same policy to replay several prompts in a row, as one run would).
    A policy that learns its loop overhead from ``accept_ms`` learns nothing of it here:
    give it ``overhead`` to replay a real run's choices.
    """
    if policy is not None:
        k = policy.k_max
    if k < 1:
        raise ValueError(f"replay needs k >= 1, got {k}")
    plain = list(plain)
    n = len(plain)
    if n == 0 or n > max_tokens:
        raise ValueError(f"plain run has {n} tokens for max_tokens={max_tokens}")
    t0 = time.perf_counter()
    drafter.begin(list(prompt), keep=0)
    out = [{"step": 0, "mode": "prefill", "k": 0, "drafted": 0, "accepted": 0, "outcomes": [], "draft": [],
            "tokens": plain[:1], "draft_ms": (time.perf_counter() - t0) * 1e3, "exact": True}]
    history = list(prompt) + [plain[0]]
    emitted, step = 1, 0
    while emitted < n:  # the speculative run ends exactly where the plain one did
        step += 1
        kk = min(k, max_tokens - emitted)
        t0 = time.perf_counter()
        draft = drafter.propose(history, kk, temperature=0.0, rng=None)
        d = list(draft.tokens[:kk])
        choice = None
        if policy is not None and d:  # as the loop: the choice's own time counts as drafting
            t_d = time.perf_counter()
            choice = policy.choose(policy.assess(drafter, draft), draft_ms=(t_d - t0) * 1e3)
            d = d[: choice.j]
        draft_ms = (time.perf_counter() - t0) * 1e3
        outcomes = [-1] * len(d)
        accepted, exact = 0, True
        for j, x in enumerate(d):
            if emitted + j >= n:  # past a stop token: the target's verdict is unknown here
                exact = False
                break
            ok = plain[emitted + j] == x
            outcomes[j] = 1 if ok else 0
            if not ok:
                break
            accepted += 1
        tokens = plain[emitted : emitted + accepted + 1]
        rec = {"step": step, "mode": "spec" if (d or policy is None) else "plain", "k": kk, "drafted": len(d),
               "accepted": accepted, "outcomes": outcomes, "draft": d, "tokens": tokens, "draft_ms": draft_ms,
               "exact": exact}
        if policy is not None:
            j = choice.j if choice else 0
            rec.update(policy_j=j, policy_pred=choice.pred[:j] if choice else [],
                       policy_bins=choice.bins[:j] if choice else [])
            if choice is not None:
                policy.observe(choice, outcomes)
        out.append(rec)
        history.extend(tokens)
        emitted += len(tokens)
    return out


def replay_sweep(prompt: Sequence[int], plain: Sequence[int], make_drafter: Callable[[], object], ks: Sequence[int],
                 *, max_tokens: int) -> dict[int, list[dict]]:
    """``replay`` for every k > 0 in ``ks``, each with a fresh drafter from ``make_drafter``."""
    return {k: replay(prompt, plain, make_drafter(), k, max_tokens=max_tokens) for k in sorted(set(ks)) if k > 0}


def summarize_replay(steps: list[dict], k: int) -> dict:
    """Acceptance of one replayed run, with the denominators of ``analysis.stats``."""
    steps = [s for s in steps if s["mode"] != "prefill"]
    spec = [s for s in steps if s["drafted"] > 0]
    drafted = sum(s["drafted"] for s in spec)
    accepted = sum(s["accepted"] for s in spec)
    first = [s["outcomes"][0] for s in spec if s["outcomes"] and s["outcomes"][0] >= 0]
    acc_pos = [sum(1 for s in spec if len(s["outcomes"]) > i and s["outcomes"][i] == 1) for i in range(k)]
    reach = [sum(1 for s in spec if len(s["outcomes"]) > i) for i in range(k)]
    return {
        "steps": len(steps), "spec_steps": len(spec), "drafted": drafted, "accepted": accepted,
        "acceptance": accepted / drafted if drafted else None,
        "first_token_acceptance": sum(first) / len(first) if first else None,
        "tokens_per_step": sum(len(s["tokens"]) for s in steps) / len(steps) if steps else None,
        "acc_pos": acc_pos, "drafts_reaching_pos": reach, "exact": all(s["exact"] for s in steps),
    }


def predict_run(records: list[dict], *, V: Callable, H: float, overhead: tuple[float, float] = (0.0, 0.0),
                prefill_ms: float = 0.0) -> dict:
    """Predicted times of one replayed run: each step costs its draft time (measured in
    the replay) + V(drafted + 1) + o0 + o1 * drafted; plain decoding of the same tokens
    costs H + o0 per token; end to end both add the target's prefill ``prefill_ms``, and
    speculation the drafter's begin (the replay's step 0). ``V``: verify(m) in ms
    (``costmodel.VerifyModel.V``)."""
    o0, o1 = overhead
    begin_ms = sum(s["draft_ms"] for s in records if s["mode"] == "prefill")
    steps = [s for s in records if s["mode"] != "prefill"]
    n_tokens = sum(len(s["tokens"]) for s in records)
    m = np.array([s["drafted"] + 1 for s in steps], dtype=float)
    spec_ms = float(sum(s["draft_ms"] for s in steps) + np.sum(V(m)) + o0 * len(steps) + o1 * np.sum(m - 1))
    plain_ms = (n_tokens - 1) * (H + o0)
    spec_e2e, plain_e2e = prefill_ms + begin_ms + spec_ms, prefill_ms + plain_ms
    return {
        "tokens": n_tokens, "pred_decode_ms": spec_ms, "pred_plain_decode_ms": plain_ms,
        "pred_decode_tok_s": 1e3 * (n_tokens - 1) / spec_ms if spec_ms > 0 else None,
        "pred_decode_speedup": plain_ms / spec_ms if spec_ms > 0 else None,
        "pred_e2e_speedup": plain_e2e / spec_e2e if spec_e2e > 0 else None,
        "pred_draft_ms_step": float(np.mean([s["draft_ms"] for s in steps])) if steps else 0.0,
    }


def prediction_table(replays: list[dict], *, V: Callable, H: float, overhead: tuple[float, float] = (0.0, 0.0))\
        -> pd.DataFrame:
    """One row per (drafter, workload, prompt, k) from replay results (``pred_acc_pos``: the
    steps that accepted draft position i, what ``labkit plan --acceptance replay:LAB:…`` reads).

    ``replays``: dicts with drafter, workload, prompt, k, steps (``replay``'s records),
    and optionally prefill_ms (the plain run's prefill).
    """
    rows = []
    for r in replays:
        s = summarize_replay(r["steps"], r["k"])
        p = predict_run(r["steps"], V=V, H=H, overhead=overhead, prefill_ms=r.get("prefill_ms", 0.0))
        rows.append({"drafter": r["drafter"], "workload": r["workload"], "prompt": r["prompt"], "k": r["k"],
                     **{f"pred_{key}": v for key, v in s.items() if key != "drafts_reaching_pos"},
                     **{key if key.startswith("pred_") else f"pred_{key}": v for key, v in p.items()}})
    return pd.DataFrame(rows)


def prediction_by_k(pred: pd.DataFrame) -> pd.DataFrame:
    """Per (drafter, k): pooled predicted acceptance and the median predicted speedups over
    prompts (the protocol's unit, one k per drafter for all workloads), and the geometric mean
    of the predicted end-to-end speedup with its interval over prompts and verdict
    (``pred_e2e_gm``, ``pred_e2e_lo``/``_hi``, ``pred_e2e_verdict``)."""
    from labkit.analysis import decide

    out = []
    for (d, k), g in pred.groupby(["drafter", "k"]):
        drafted = g["pred_drafted"].sum()
        # the prediction's own spread over prompts, judged like a measurement (a t interval of
        # the geometric mean; it knows nothing of the cost model's error, and says so where shown)
        est = decide.estimate(pd.DataFrame({"prompt": g["prompt"].astype(str).to_numpy(), "round": 0,
                                            "ratio": g["pred_e2e_speedup"].astype(float).to_numpy()}))
        out.append({"drafter": d, "k": int(k), "prompts": len(g),
                    "pred_e2e_gm": est.ratio, "pred_e2e_lo": est.lo, "pred_e2e_hi": est.hi,
                    "pred_e2e_verdict": est.verdict,
                    "pred_acceptance": float(g["pred_accepted"].sum() / drafted) if drafted else None,
                    "pred_tokens_per_step": float(g["pred_tokens_per_step"].mean()),
                    "pred_e2e_speedup": float(g["pred_e2e_speedup"].median()),
                    "pred_decode_speedup": float(g["pred_decode_speedup"].median()),
                    "pred_exact": bool(g["pred_exact"].all())})
    return pd.DataFrame(out)


def beside_measured(pred_by_k: pd.DataFrame, rows: pd.DataFrame, *, temperature: float = 0.0) -> pd.DataFrame:
    """Predicted (every k) beside measured (the arms that were run) per (drafter, k):
    e2e and decode speedup vs plain, acceptance and first-token acceptance, prediction error."""
    from labkit.analysis.protocol import step_summary

    spec = rows[(rows["k"] > 0) & (rows["temperature"] == temperature)]
    measured = pd.DataFrame([step_summary(rows, d, int(k), temperature=temperature)
                             for (d, k), _ in spec.groupby(["drafter", "k"])])
    if measured.empty:
        out = pred_by_k.assign(measured=False)
    else:
        out = pred_by_k.merge(measured.drop(columns=["temperature"]), on=["drafter", "k"], how="outer")
        out["measured"] = out["e2e_speedup"].notna()
        out["e2e_error"] = out["pred_e2e_speedup"] / out["e2e_speedup"] - 1
    return out.sort_values(["drafter", "k"]).reset_index(drop=True)
