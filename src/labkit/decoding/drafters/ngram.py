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
        # the evidence a draft length policy reads (never the proposal): how often each
        # n-gram occurred followed by anything, and followed by each token
        self._seen: list[dict[tuple, int]] = [{} for _ in range(self.n_max + 1)]
        self._follow: list[dict[tuple, int]] = [{} for _ in range(self.n_max + 1)]
        self._extend(history)

    def _extend(self, tokens: Sequence[int]) -> None:
        h = self._hist
        for t in tokens:
            j = len(h)  # position t lands at: the n-grams ending at j-1 are followed by it
            for n in range(self.n_min, self.n_max + 1):
                if j >= n:
                    g = tuple(h[j - n : j])
                    self._index[n][g] = j
                    self._seen[n][g] = self._seen[n].get(g, 0) + 1
                    self._follow[n][(*g, t)] = self._follow[n].get((*g, t), 0) + 1
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

    def evidence(self, draft: Draft) -> list[dict]:
        """Per drafted position i: the match length ``n`` and, for the n tokens before
        position i (history, then the draft itself), how often they occurred in the
        history (``total``) and how often the drafted token followed them (``seen``).
        Read from the index after ``propose``; it does not change what is proposed."""
        n = int(draft.info.get("ngram", 0))
        if n == 0 or not draft.tokens:
            return []
        tail = list(self._hist[-n:])
        out = []
        for t in draft.tokens:
            g = tuple(tail[-n:])
            out.append({"n": n, "seen": self._follow[n].get((*g, t), 0), "total": self._seen[n].get(g, 0)})
            tail.append(t)
        return out

    def describe(self) -> dict:
        return {"drafter": self.name, "ngram_min": self.n_min, "ngram_max": self.n_max}
