"""Drafters propose up to k next tokens; the target verifies them.

Each drafter sees the full token history (prompt + emitted, the last of which is not
yet in the target's cache) and returns a :class:`Draft`. Draft cost is whatever
``propose`` spends, timed by the loop. Drafters are made by factories registered in ``labkit.decoding.drafters``.
"""

from __future__ import annotations

import abc
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np


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
    # set by a draft length policy: model drafters then record, per drafted token, the
    # probability they gave it (``Draft.info["p"]``); off by default, it costs a softmax a row
    collect_evidence: bool = False

    @property
    def own_engine(self):
        """The engine the drafter runs on its own (a draft model's), or None."""
        return None

    def begin(self, prompt: Sequence[int], *, keep: int = 0) -> None:  # noqa: B027 - optional hook
        """Called once per generation, after the target's prefill (``keep``: see Engine.prefill)."""

    @abc.abstractmethod
    def propose(
        self, history: Sequence[int], k: int, *, temperature: float = 0.0, rng: np.random.Generator | None = None
    ) -> Draft: ...

    def evidence(self, draft: Draft) -> list[dict]:
        """The drafter's own evidence per drafted position, for a draft length policy:
        by default the probability it gave each token (``{"p": ...}``), when recorded."""
        return [{"p": float(p)} for p in draft.info.get("p", [])]

    def describe(self) -> dict:
        return {"drafter": self.name}

    def close(self) -> None:  # noqa: B027 - optional hook
        pass
