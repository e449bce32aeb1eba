"""One record per decoding step: what the loop yields and every statistic is computed from.

Built with keyword arguments only, so a field added later cannot shift the others.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass


@dataclass(kw_only=True)
class StepRecord:
    step: int
    mode: str  # "prefill" | "plain" | "spec" | "probe"
    k: int  # draft length asked for
    drafted: int  # draft length proposed (may be < k, or 0 when the drafter has nothing)
    accepted: int
    outcomes: list[int]  # per drafted position: 1 accepted, 0 rejected, -1 not tested
    draft: list[int]  # the drafted tokens themselves
    m: int  # rows decoded by the target this step
    draft_ms: float
    verify_ms: float
    accept_ms: float  # choosing tokens, rollback, bookkeeping
    tokens: list[int]  # emitted this step
    from_draft: list[bool]
    t_ms: float  # end of this step, ms since the generation began
    gate: str | None = None  # gate event at this step, with its reason
    # a draft length policy's decision (``decoding.policy``): the j it chose (None: no
    # policy), its predicted conditional acceptance and evidence bin per proposed position
    policy_j: int | None = None
    policy_pred: list[float] | None = None
    policy_bins: list[str] | None = None

    @property
    def step_ms(self) -> float:
        return self.draft_ms + self.verify_ms + self.accept_ms

    def to_dict(self) -> dict:
        return asdict(self)
