"""Cross-engine agreement: the same token ids through two engines (llama.cpp and MLX),
greedy, compared token by token and logit row by logit row. It decodes, so it lives with
the measurements; the conversion it checks is ``artifacts.mlx_convert``.
"""

from __future__ import annotations

import numpy as np


def cross_engine_agreement(ref, other, prompt: list[int], *, n: int = 32) -> dict:
    """Greedy-decode ``n`` tokens of ``prompt`` on two engines and compare them.

    Both decode plainly (prefill, then one row per token: the loop's k = 0 path) and
    keep every logits row, so the first divergence is explained without a replay: each
    engine's gap is its logit of its own token minus that of the other engine's token
    (>= 0 by construction; small on both sides is a near-tie, not a conversion error).
    ``top_diff`` is the largest logit difference over the union of both engines' top-5
    tokens, per position along the agreed prefix (``[0]`` is the prefill row).
    """
    from labkit.analysis.lossless import first_divergence

    a, ra = _greedy_rows(ref, prompt, n)
    b, rb = _greedy_rows(other, prompt, n)
    i = first_divergence(a, b)
    agreed = n if i is None else i
    top_diff = []
    for j in range(min(agreed + 1, n)):
        top = np.unique(np.concatenate([np.argpartition(ra[j], -5)[-5:], np.argpartition(rb[j], -5)[-5:]]))
        top_diff.append(float(np.abs(ra[j][top] - rb[j][top]).max()))
    out = {"n": n, "prompt_tokens": len(prompt), "agreed": agreed, "identical": i is None,
           "prefill_top_diff": top_diff[0], "max_top_diff": max(top_diff), "divergence": None}
    if i is not None:
        ta, tb = a[i], b[i]
        out["divergence"] = {
            "index": i, "ref_token": ta, "other_token": tb,
            "ref_gap": float(ra[i][ta] - ra[i][tb]), "other_gap": float(rb[i][tb] - rb[i][ta]),
            "ref_tokens_after": a[i:], "other_tokens_after": b[i:],
        }
    return out


def _greedy_rows(engine, prompt: list[int], n: int) -> tuple[list[int], list[np.ndarray]]:
    engine.rollback(0)
    engine.decode(list(prompt), all_logits=False)
    toks, rows = [], []
    while True:
        rows.append(np.array(engine.logits(-1), copy=True))
        toks.append(int(np.argmax(rows[-1])))
        if len(toks) == n:
            break
        engine.decode([toks[-1]])
    engine.rollback(0)
    return toks, rows
