"""A smaller draft model on its own engine: greedy (or sampled, with its probabilities for
the rejection sampler) k-token drafts, its cache kept in step with the target's history.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from labkit.decoding.drafters.base import Draft, Drafter
from labkit.decoding.sampling import sample, softmax
from labkit.errors import LabkitError


class ModelDrafter(Drafter):
    """A separate, cheaper model with the target's vocabulary drafts autoregressively.

    Its cache holds the history it has seen plus its own last drafts; each proposal
    first rolls back to the common prefix with the real history, so rejected drafts
    are forgotten and accepted ones are not recomputed.
    """

    name = "model"

    def __init__(self, engine, *, target=None):
        self.engine = engine
        if target is not None:
            same_size = engine.n_vocab == target.n_vocab
            a = engine.vocab_fingerprint() if same_size else f"{engine.n_vocab} tokens"
            b = target.vocab_fingerprint() if same_size else f"{target.n_vocab} tokens"
            if a != b:
                raise LabkitError(
                    f"the draft model's vocabulary ({engine.n_vocab} tokens, fingerprint {a}) differs from the "
                    f"target's ({target.n_vocab} tokens, fingerprint {b})",
                    "use a draft model from the same family/tokenizer as the target "
                    "(e.g. a lower-bit quantisation of the same model)",
                )
        self._n_seen = 0

    @property
    def own_engine(self):
        return self.engine

    def begin(self, prompt: Sequence[int], *, keep: int = 0) -> None:
        self.engine.prefill(prompt, keep=keep)
        self._n_seen = len(prompt)

    def propose(self, history, k, *, temperature=0.0, rng=None) -> Draft:
        if k <= 0:
            return Draft([])
        e = self.engine
        # The history only grows, so its prefix seen at the last call is still cached;
        # scan on from there. At least the last token is always (re)decoded.
        cached = e.kv_tokens
        limit = min(len(cached), len(history) - 1)
        common = min(self._n_seen, limit)
        while common < limit and cached[common] == history[common]:
            common += 1
        e.rollback(common)
        e.decode(list(history[common:]), all_logits=False)
        self._n_seen = len(history)
        out: list[int] = []
        qs: list[np.ndarray] | None = [] if temperature > 0 else None
        ps: list[float] = []
        for i in range(k):
            if temperature > 0:
                q = softmax(e.logits(-1), temperature)
                t = sample(q, rng)
                qs.append(q)
            else:
                t = e.argmax(-1)
            if self.collect_evidence:  # the probability the draft gave its token (policy evidence)
                ps.append(float(qs[-1][t]) if temperature > 0 else float(softmax(e.logits(-1), 1.0)[t]))
            out.append(t)
            if i + 1 < k:
                e.decode([t])
        return Draft(out, q=qs, info={"p": ps} if self.collect_evidence else {})

    def describe(self) -> dict:
        return {"drafter": self.name, "draft_engine": self.engine.describe()}

    def close(self) -> None:
        self.engine.close()
