"""Statistics derived from step records, after the fact (never inside the loop).

Denominators, stated once:
- ``acceptance`` (per drafted token) = accepted / drafted, as llama.cpp's
  ``n_accept / n_draft`` reports it.
- ``acceptance_tested`` (per tested token) = accepted / drafted tokens the target
  actually compared (positions after the first rejection are never tested).
- ``accept_by_pos[i]`` (vLLM's per-position acceptance) = steps whose draft
  position i was accepted / steps that drafted at least i+1 tokens.
- ``accept_cond_by_pos[i]`` = accepted at i / tested at i, the conditional rate
  P(accept i | positions < i accepted).
- ``mean_accepted`` = accepted drafts per speculative step; ``tokens_per_step``
  adds the target's own token (the mean accepted length llama.cpp prints).
- ``rejected_ms``: draft and verify time attributed to drafts that were not
  accepted, in proportion (draft_ms x rejected/drafted + verify_ms x rejected/m).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass

import numpy as np


def _decode_steps(records):
    return [r for r in records if r.mode != "prefill"]


@dataclass(frozen=True, kw_only=True)
class Summary:
    """Throughput, latency and acceptance of one generation (denominators: module doc)."""

    tokens: int
    decode_tokens: int
    decode_ms: float
    decode_tok_s: float | None
    ttft_ms: float | None
    ttlt_ms: float | None
    e2e_tok_s: float | None
    prefill_tokens: int
    steps: int
    spec_steps: int
    plain_steps: int
    drafted: int
    accepted: int
    acceptance: float | None
    acceptance_tested: float | None
    mean_accepted: float | None
    tokens_per_step: float | None
    accept_by_pos: list
    accept_cond_by_pos: list
    drafts_reaching_pos: list
    draft_ms: float
    verify_ms: float
    accept_ms: float
    rejected_ms: float
    rejected_share: float | None
    gate_events: list
    repetition: float | None

    def to_dict(self) -> dict:
        return asdict(self)


def summarize(records: Sequence, *, k_max: int | None = None) -> Summary:
    """Throughput, latency and acceptance of one generation."""
    pre = [r for r in records if r.mode == "prefill"]
    dec = _decode_steps(records)
    spec = [r for r in dec if r.drafted > 0]
    n_dec = sum(len(r.tokens) for r in dec)
    dec_ms = sum(r.step_ms for r in dec)
    drafted = sum(r.drafted for r in spec)
    accepted = sum(r.accepted for r in spec)
    tested = sum(sum(1 for o in r.outcomes if o >= 0) for r in spec)
    kmax = k_max if k_max is not None else max((r.drafted for r in spec), default=0)
    reached = np.zeros(kmax, int)
    acc_pos = np.zeros(kmax, int)
    tested_pos = np.zeros(kmax, int)
    for r in spec:
        for i, o in enumerate(r.outcomes[:kmax]):
            reached[i] += 1
            if o >= 0:
                tested_pos[i] += 1
            if o == 1:
                acc_pos[i] += 1
    rejected_ms = sum(
        r.draft_ms * (r.drafted - r.accepted) / r.drafted + r.verify_ms * (r.drafted - r.accepted) / r.m
        for r in spec
    )
    ttft = pre[0].t_ms if pre else None
    ttlt = records[-1].t_ms if records else None
    n_total = sum(len(r.tokens) for r in records)
    return Summary(
        tokens=n_total,
        decode_tokens=n_dec,
        decode_ms=dec_ms,
        decode_tok_s=1e3 * n_dec / dec_ms if dec_ms > 0 else None,
        ttft_ms=ttft,
        ttlt_ms=ttlt,
        e2e_tok_s=1e3 * n_total / ttlt if ttlt else None,
        prefill_tokens=pre[0].m if pre else 0,
        steps=len(dec),
        spec_steps=len(spec),
        plain_steps=sum(1 for r in dec if r.mode == "plain"),
        drafted=drafted,
        accepted=accepted,
        acceptance=accepted / drafted if drafted else None,
        acceptance_tested=accepted / tested if tested else None,
        mean_accepted=accepted / len(spec) if spec else None,
        tokens_per_step=n_dec / len(dec) if dec else None,
        accept_by_pos=[float(a / n) if n else None for a, n in zip(acc_pos, reached, strict=True)],
        accept_cond_by_pos=[float(a / n) if n else None for a, n in zip(acc_pos, tested_pos, strict=True)],
        drafts_reaching_pos=reached.tolist(),
        draft_ms=sum(r.draft_ms for r in dec),
        verify_ms=sum(r.verify_ms for r in dec),
        accept_ms=sum(r.accept_ms for r in dec),
        rejected_ms=rejected_ms,
        rejected_share=rejected_ms / dec_ms if dec_ms else None,
        gate_events=[{"step": r.step, "event": r.gate} for r in records if r.gate],
        repetition=repetition(tokens_from(records)),
    )


def tokens_from(records: Sequence) -> list[int]:
    return [t for r in records for t in r.tokens]


def repetition(tokens: Sequence[int], *, n: int = 4) -> float | None:
    """Share of the output's n-grams that already occurred earlier in the output.

    High values mark a repetition loop, which inflates n-gram acceptance without
    any real predictability of the text.
    """
    if len(tokens) < n + 1:
        return None
    seen: set[tuple] = set()
    repeats = 0
    total = 0
    for i in range(len(tokens) - n + 1):
        g = tuple(tokens[i : i + n])
        total += 1
        if g in seen:
            repeats += 1
        seen.add(g)
    return repeats / total


def spread(values: Sequence[float]) -> dict:
    """Median and range of repeats: the only way a timing is reported."""
    v = [x for x in values if x is not None]
    if not v:
        return {"median": None, "min": None, "max": None, "n": 0, "values": []}
    return {
        "median": float(np.median(v)),
        "min": float(min(v)),
        "max": float(max(v)),
        "n": len(v),
        "values": [float(x) for x in v],
    }


def pos_sum(per_run: Iterable, k: int) -> np.ndarray:
    """Per-position counts summed over runs, positions 0..k-1. A run's arrays are as long as
    the longest draft of the arms measured with it (a search round with k auto <= 8 beside
    k = 4 records 8 positions; a later round of k = 4 alone, 4), so they are cut or padded
    to k: past k a fixed-k run has nothing."""
    out = np.zeros(k, dtype=float)
    for a in per_run:
        a = np.asarray(a if a is not None else [], dtype=float)[:k]
        out[: len(a)] += a
    return out
