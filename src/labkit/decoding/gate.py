"""The acceptance gate: below a rolling acceptance threshold, fall back to plain decoding,
and re-probe now and then. It must steer the loop, so it reads each record as it is made;
its threshold is the recipe's, resolved once at the boundary (``config.recipe.resolve``),
never from the environment here.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

from labkit.decoding.records import StepRecord
from labkit.errors import LabkitError

DEFAULT_GATE = 0.60


@dataclass
class AcceptanceGate:
    """Rolling acceptance gate: below ``threshold`` over the last ``window`` drafted
    tokens, fall back to plain decoding; after ``probe_every`` plain tokens, try one
    speculative step and reopen if it clears the threshold.
    """

    threshold: float = DEFAULT_GATE
    window: int = 32
    min_samples: int = 8
    probe_every: int = 32
    open: bool = True
    _recent: deque = field(default_factory=deque)
    _plain_since: int = 0

    def __post_init__(self):
        if not 0.0 <= self.threshold <= 1.0:
            raise LabkitError(f"gate threshold {self.threshold} is outside [0, 1]", "use e.g. 0.6, or 0 to disable")

    def rate(self) -> float | None:
        return sum(self._recent) / len(self._recent) if self._recent else None

    def wants_probe(self) -> bool:
        return not self.open and self._plain_since >= self.probe_every

    def update(self, rec: StepRecord) -> str | None:
        """Feed one record; returns the event text when the gate changes state."""
        if rec.mode == "plain":
            self._plain_since += len(rec.tokens)
            return None
        if rec.drafted == 0:
            return None
        # per drafted token: an untested draft position counts as not accepted
        outcomes = [1 if o == 1 else 0 for o in rec.outcomes]
        if rec.mode == "probe":
            r = sum(outcomes) / len(outcomes)
            self._plain_since = 0
            if r >= self.threshold:
                self.open = True
                self._recent.clear()
                self._recent.extend(outcomes)
                return f"reopened: probe acceptance {r:.2f} >= {self.threshold:.2f}"
            return None
        self._recent.extend(outcomes)
        while len(self._recent) > self.window:
            self._recent.popleft()
        r = self.rate()
        if len(self._recent) >= self.min_samples and r < self.threshold:
            self.open = False
            self._plain_since = 0
            return (
                f"closed: rolling acceptance {r:.2f} < {self.threshold:.2f} "
                f"over the last {len(self._recent)} drafted tokens"
            )
        return None
