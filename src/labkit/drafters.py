"""Drafters propose up to k next tokens; the target verifies them.

Each drafter sees the full token history (prompt + emitted, the last of which is not
yet in the target's cache) and returns a :class:`Draft`. Draft cost is whatever
``propose`` spends, timed by the loop. Drafters are looked up in ``DRAFTERS``.
"""

from __future__ import annotations

import abc
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from .errors import LabkitError
from .sampling import sample, softmax


@dataclass
class Draft:
    tokens: list[int]
    # Draft probabilities per drafted position (model drafters when sampling); None
    # means the draft is deterministic (q is one-hot on the drafted token).
    q: list[np.ndarray] | None = None
    info: dict = field(default_factory=dict)


class Drafter(abc.ABC):
    name: str = "base"
    supports_prompt_reuse: bool = True  # may begin() keep a shared prompt prefix cached?

    def begin(self, prompt: Sequence[int], *, keep: int = 0) -> None:  # noqa: B027 - optional hook
        """Called once per generation, after the target's prefill (``keep``: see Engine.prefill)."""

    @abc.abstractmethod
    def propose(
        self, history: Sequence[int], k: int, *, temperature: float = 0.0, rng: np.random.Generator | None = None
    ) -> Draft: ...

    def describe(self) -> dict:
        return {"drafter": self.name}

    def close(self) -> None:  # noqa: B027 - optional hook
        pass


class NgramDrafter(Drafter):
    """Prompt lookup: find the most recent earlier occurrence of the history's last
    n tokens (longest n first, ``n_max`` down to ``n_min``) and propose what followed.

    This is llama.cpp's lookup/ngram-simple idea with an incremental index: each
    appended token costs O(n_max) dict updates, a proposal O(n_max) lookups.
    """

    name = "ngram"

    def __init__(self, *, n_min: int = 2, n_max: int = 4):
        if not 1 <= n_min <= n_max:
            raise LabkitError(f"bad n-gram sizes n_min={n_min}, n_max={n_max}", "use 1 <= ngram_min <= ngram_max")
        self.n_min, self.n_max = n_min, n_max
        self._reset([])

    def _reset(self, history: Sequence[int]) -> None:
        self._hist: list[int] = []
        self._index: list[dict[tuple, int]] = [{} for _ in range(self.n_max + 1)]
        self._extend(history)

    def _extend(self, tokens: Sequence[int]) -> None:
        h = self._hist
        for t in tokens:
            j = len(h)  # position t lands at: the n-grams ending at j-1 are followed by it
            for n in range(self.n_min, self.n_max + 1):
                if j >= n:
                    self._index[n][tuple(h[j - n : j])] = j
            h.append(t)

    def begin(self, prompt: Sequence[int], *, keep: int = 0) -> None:
        self._reset(prompt)

    def propose(self, history, k, *, temperature=0.0, rng=None) -> Draft:
        h = self._hist
        if len(history) < len(h):
            self._reset(history)  # a new, shorter history: start over
            h = self._hist
        else:
            self._extend(history[len(h) :])
        for n in range(min(self.n_max, len(h)), self.n_min - 1, -1):
            start = self._index[n].get(tuple(h[-n:]))
            if start is not None:
                return Draft(h[start : start + k], info={"ngram": n})
        return Draft([], info={"ngram": 0})

    def describe(self) -> dict:
        return {"drafter": self.name, "ngram_min": self.n_min, "ngram_max": self.n_max}


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
        for i in range(k):
            if temperature > 0:
                q = softmax(e.logits(-1), temperature)
                t = sample(q, rng)
                qs.append(q)
            else:
                t = e.argmax(-1)
            out.append(t)
            if i + 1 < k:
                e.decode([t])
        return Draft(out, q=qs)

    def describe(self) -> dict:
        return {"drafter": self.name, "draft_engine": self.engine.describe()}

    def close(self) -> None:
        self.engine.close()


DRAFTERS: dict[str, type[Drafter]] = {"ngram": NgramDrafter, "model": ModelDrafter}


def register(name: str, cls: type[Drafter]) -> None:
    DRAFTERS[name] = cls
