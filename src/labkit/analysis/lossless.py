"""Is speculative greedy output the plain greedy output? And if not, why not?

Batched (m-row) and single-row CPU kernels quantise activations differently, so a
verify row's logits differ from the plain step's by up to ~1 logit here (measured by
``bench.kernel_noise``), and the argmax can flip where the top two are nearly tied.
A divergence is never silently accepted. Given the step records of both runs, the
row that decided the divergent position is recomputed exactly as each run computed
it (same batches, same cache history: llama.cpp is deterministic for a fixed batch
layout), and the report gives, at that position:

- ``plain_gap``: plain row's logit of the plain token minus that of the speculative one
- ``spec_gap``: the speculative row's logit of its token minus that of the plain one
- ``noise_top``: the largest difference between the two rows over their top tokens

It is a numerical near-tie when ``plain_gap`` is within what the kernels' disagreement
at that very position can flip: ``plain_gap <= max(near_tie, 2 * noise_top)``, and
never beyond ``MAX_NEAR_TIE``. A logic error (a wrong draft accepted) shows up as a
gap of several logits and fails.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

DEFAULT_NEAR_TIE = 0.25  # logits: the floor of the near-tie band
MAX_NEAR_TIE = 1.5  # logits: no divergence beyond this is called numerical


def first_divergence(a: Sequence[int], b: Sequence[int]) -> int | None:
    n = min(len(a), len(b))
    for i in range(n):
        if a[i] != b[i]:
            return i
    return None if len(a) == len(b) else n


def _tokens(x) -> list[int]:
    if x and not isinstance(x[0], (int, np.integer)):
        return [t for r in x for t in r.tokens]
    return list(x)


def divergence_report(engine, prompt: Sequence[int], plain, spec, *, near_tie: float = DEFAULT_NEAR_TIE) -> dict:
    """Compare two greedy runs (step records, or token lists) and explain any divergence."""
    a, b = _tokens(plain), _tokens(spec)
    i = first_divergence(a, b)
    if i is None:
        return {"lossless": True, "identical": True, "divergence": None}
    if i >= min(len(a), len(b)):
        return {"lossless": False, "identical": False,
                "divergence": {"index": i, "reason": "one output is a prefix of the other",
                               "plain_len": len(a), "spec_len": len(b)}}
    p_row = _replay(engine, prompt, plain, i)
    top1, top2, gap12 = top2_gap(p_row)
    plain_gap = float(p_row[a[i]] - p_row[b[i]])
    div = {"index": i, "plain_token": int(a[i]), "spec_token": int(b[i]), "plain_top1": top1,
           "plain_top2": top2, "top2_gap": gap12, "plain_gap": plain_gap}
    band = near_tie
    if spec and not isinstance(spec[0], (int, np.integer)):
        s_row = _replay(engine, prompt, spec, i)
        top = np.unique(np.concatenate([np.argsort(p_row)[-5:], np.argsort(s_row)[-5:]]))
        noise = float(np.abs(s_row[top] - p_row[top]).max())
        div.update(spec_gap=float(s_row[b[i]] - s_row[a[i]]), noise_top=noise)
        band = max(near_tie, 2 * noise)
    band = min(band, MAX_NEAR_TIE)
    tie = 0 <= plain_gap <= band
    div.update(near_tie=tie, near_tie_band=band)  # the cache keeps only a shared prefix (see _replay)
    return {"lossless": tie, "identical": False, "divergence": div}


def _replay(engine, prompt, run, index: int) -> np.ndarray:
    """The logits row that chose output ``index``, recomputed as the run computed it.

    ``run`` is step records (every batch replayed exactly) or a token list (replayed as
    plain decoding: prefill, then one row per token). The cache is left holding only the
    run's shared prefix (a few-shot preamble kept across tasks, as the run kept it), so the
    next replay of a run over the same preamble does not compute it again.
    """
    keep = 0 if run and isinstance(run[0], (int, np.integer)) else len(prompt) - run[0].m
    engine.prefill(prompt, keep=keep)  # the same batches as the run's prefill
    if index == 0:
        row = np.array(engine.logits(-1))
        engine.rollback(keep)
        return row
    if run and isinstance(run[0], (int, np.integer)):
        steps = [([], 1, 0, [t]) for t in run[1:]]  # plain: one row per token
        hist = [run[0]]
    else:
        hist = list(run[0].tokens)
        steps = [(r.draft, len(r.tokens), r.accepted, r.tokens) for r in run[1:]]
    emitted = len(hist)
    for drafts, n_out, n_acc, toks in steps:
        base = engine.n_past
        engine.decode([hist[-1], *drafts], all_logits=True)
        if index < emitted + n_out:
            row = np.array(engine.logits(index - emitted))
            engine.rollback(keep)
            return row
        engine.rollback(base + 1 + n_acc)
        hist.extend(toks)
        emitted += n_out
    engine.rollback(keep)
    raise IndexError(f"output index {index} is beyond the replayed run")


def verify_oracle(engine, prompt: Sequence[int], records) -> list[dict]:
    """The exact check of a greedy speculative run, step by step: replaying its recorded
    verify batches (same rows, same cache history), every accepted draft token must be the
    argmax of the row that verified it, the first rejected one must not be, and the token
    the target added must be the argmax of its row. Returns the violations (empty: exact).
    """
    keep = len(prompt) - records[0].m
    engine.prefill(prompt, keep=keep)
    bad = []
    first = engine.argmax(-1)
    if records[0].tokens[0] != first:
        bad.append({"step": 0, "position": 0, "expected": first, "got": records[0].tokens[0]})
    last = records[0].tokens[-1]
    for r in records[1:]:
        base = engine.n_past
        engine.decode([last, *r.draft], all_logits=True)
        top = [engine.argmax(i) for i in range(len(r.draft) + 1)]
        for i in range(r.accepted):  # accepted drafts: each the argmax of the row before it
            if r.draft[i] != top[i]:
                bad.append({"step": r.step, "position": i, "expected": top[i], "got": r.draft[i],
                            "what": "accepted draft is not the target's argmax"})
        if r.accepted < len(r.draft) and r.draft[r.accepted] == top[r.accepted]:
            bad.append({"step": r.step, "position": r.accepted, "expected": "a rejection",
                        "got": r.draft[r.accepted], "what": "draft equal to the argmax was rejected"})
        # the target's own token closes the step (unless max_tokens cut the step short)
        if len(r.tokens) == r.accepted + 1 and r.tokens[-1] != top[r.accepted]:
            bad.append({"step": r.step, "position": r.accepted, "expected": top[r.accepted],
                        "got": r.tokens[-1], "what": "target token is not the argmax of its row"})
        engine.rollback(base + 1 + r.accepted)
        last = r.tokens[-1]
    engine.rollback(0)
    return bad


def top2_gap(logits: np.ndarray) -> tuple[int, int, float]:
    """(top token, runner-up, logit gap) of one row; a small gap marks a numerical near-tie."""
    idx = np.argpartition(logits, -2)[-2:]
    a, b = (int(idx[1]), int(idx[0])) if logits[idx[1]] >= logits[idx[0]] else (int(idx[0]), int(idx[1]))
    return a, b, float(logits[a] - logits[b])
