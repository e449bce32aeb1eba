"""Prompt-lookup (n-gram) drafting: propose the continuation of the longest recent n-gram
that recurs in the history, from an index updated incrementally as tokens arrive.
"""

from __future__ import annotations

from collections.abc import Sequence

from labkit.decoding.drafters.base import Draft, Drafter
from labkit.errors import LabkitError


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
