"""Token choice and speculative acceptance, as small pure functions over logit rows.

Greedy verification accepts a drafted token iff it is the target's argmax. Sampled
verification is the standard speculative-sampling rule (Leviathan et al. 2023;
Chen et al. 2023), which leaves the emitted tokens distributed exactly as the
target's own samples: accept draft x with probability min(1, p(x)/q(x)); on
rejection emit a sample of the residual max(0, p - q), renormalised. A
deterministic drafter (n-gram lookup, greedy MTP) is the q = one-hot(x) case:
accept with probability p(x), resample from p with x removed.
"""

from __future__ import annotations

import numpy as np


def softmax(logits: np.ndarray, temperature: float) -> np.ndarray:
    """Probabilities of one row at ``temperature`` (float64; the input is not modified)."""
    z = logits.astype(np.float64) / temperature
    z -= z.max()
    np.exp(z, out=z)
    z /= z.sum()
    return z


def sample(p: np.ndarray, rng: np.random.Generator) -> int:
    """One draw from ``p`` by inverse CDF (one uniform per draw keeps streams reproducible)."""
    c = np.cumsum(p)
    return int(min(np.searchsorted(c, rng.random() * c[-1], side="right"), len(p) - 1))


def accept_or_resample(
    p: np.ndarray, x: int, q: np.ndarray | None, rng: np.random.Generator
) -> tuple[bool, int]:
    """Speculative-sampling decision for draft token ``x``.

    ``p``: target probabilities at this position; ``q``: draft probabilities, or
    None for a deterministic draft. Returns (accepted, token): the token is ``x``
    when accepted, else a draw from the residual distribution.
    """
    px = p[x]
    qx = 1.0 if q is None else q[x]
    if qx <= 0.0:  # the draft could not have produced x; treat as a rejection
        ratio = 0.0
    else:
        ratio = px / qx
    if rng.random() < min(1.0, ratio):
        return True, x
    if q is None:
        r = p.copy()
        r[x] = 0.0
    else:
        r = np.maximum(p - q, 0.0)
    total = r.sum()
    if total <= 0.0:  # p == q exactly: any draw from p is correct
        return False, sample(p, rng)
    return False, sample(r / total, rng)


def accept_drafts(drafts, q, *, greedy: bool, argmax, logits, temperature: float,
                  rng: np.random.Generator) -> tuple[list[int], list[int], int]:
    """Walk ``drafts`` against their verify rows (row j verifies ``drafts[j]``): greedy
    accepts while the row's argmax (``argmax(j)``) is the draft; sampling runs
    ``accept_or_resample`` on ``logits(j)`` with the draft's ``q`` (None: deterministic).

    Returns the emitted tokens (the accepted drafts, then the target's token at the first
    rejection), each draft's outcome (1 accepted, 0 rejected, -1 not reached) and the
    number accepted. The bonus token after a fully accepted draft is the caller's.
    """
    out: list[int] = []
    outcomes = [-1] * len(drafts)
    n_acc = 0
    for j, x in enumerate(drafts):
        if greedy:
            t = int(argmax(j))
            ok = t == x
        else:
            ok, t = accept_or_resample(softmax(logits(j), temperature), x, q[j] if q is not None else None, rng)
        outcomes[j] = 1 if ok else 0
        out.append(t)
        if not ok:
            break
        n_acc += 1
    return out, outcomes, n_acc
