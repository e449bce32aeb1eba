"""The decoding loop: a generator yielding one :class:`StepRecord` per step.

Plain decoding is the same loop with k = 0 (one row per step), so baseline and
speculative runs are timed and counted identically. Each speculative step:

    draft   d_1..d_k            = drafter.propose(history, k)        (draft_ms)
    verify  [t_last, d_1..d_k]  -> k+1 logit rows, one llama_decode  (verify_ms)
    accept  the longest prefix the target agrees with, plus one target token
    rollback the cache to drop the rows of rejected drafts

Statistics, gates and cost fits are computed from the records (see ``stats``), except
the acceptance gate, which must steer the loop and so reads each record as it is made.
"""

from __future__ import annotations

import time
from collections.abc import Iterator, Sequence

import numpy as np

from labkit.decoding.drafters.base import Draft, Drafter
from labkit.decoding.gate import AcceptanceGate
from labkit.decoding.policy import Choice, Policy
from labkit.decoding.records import StepRecord
from labkit.decoding.sampling import accept_drafts, sample, softmax
from labkit.errors import LabkitError

DEFAULT_MAX_TOKENS = 128


def check_step_args(k: int, temperature: float, *, has_drafter: bool, drafter_hint: str) -> None:
    """The checks every decoding loop makes on k, its drafter and the temperature."""
    if k < 0:
        raise LabkitError(f"k = {k} is negative", "use k >= 0 (k = 0 is plain decoding)")
    if k > 0 and not has_drafter:
        raise LabkitError(f"k = {k} needs a drafter", f"{drafter_hint}, or k = 0")
    if temperature < 0:
        raise LabkitError(f"temperature {temperature} is negative", "use 0 (greedy) or a positive value")


def generate(
    engine,
    prompt: Sequence[int],
    *,
    drafter: Drafter | None = None,
    k: int = 0,
    max_tokens: int = DEFAULT_MAX_TOKENS,
    temperature: float = 0.0,
    seed: int = 0,
    gate: AcceptanceGate | None = None,
    stop_at_eog: bool = True,
    stop_tokens: frozenset[int] | set[int] = frozenset(),
    keep_prefix: int = 0,
    policy: Policy | None = None,
) -> Iterator[StepRecord]:
    """Decode ``prompt`` (token ids) for up to ``max_tokens`` tokens, yielding one record per step.

    Generation ends after an end-of-generation token (``stop_at_eog``) or any token in
    ``stop_tokens``, which is emitted and ends the output, as in plain decoding.
    ``keep_prefix`` marks the first tokens of the prompt as a prefix shared across
    generations (a few-shot preamble), kept in the cache(s) between them; the prefill
    record's m then counts the rows actually decoded (see ``Engine.prefill``).
    ``policy`` (``decoding.policy``) chooses each step's draft length j = 0..policy.k_max
    from the drafter's proposal of k_max tokens (``k`` is then k_max; the gate is its job).
    """
    k = check_policy_args(policy, k, gate, has_drafter=drafter is not None)
    check_step_args(k, temperature, has_drafter=drafter is not None, drafter_hint="pass --drafter ngram|model|mtp")
    if not prompt:
        raise LabkitError("the prompt is empty", "give at least one token")
    engine.check_fits(len(prompt) + max_tokens + k - engine.n_past,
                      what=f"prompt ({len(prompt)} tokens) + max_tokens + k")
    keep = keep_prefix if drafter is None or drafter.supports_prompt_reuse else 0
    rng = np.random.default_rng(seed)
    greedy = temperature == 0.0

    def choose(row: int) -> int:
        return engine.argmax(row) if greedy else sample(softmax(engine.logits(row), temperature), rng)

    t_start = time.perf_counter()
    rows = engine.prefill(prompt, keep=keep)
    t_pf = time.perf_counter()
    if drafter is not None:  # e.g. a draft model's own prefill: part of time-to-first-token
        drafter.begin(prompt, keep=keep)
    t_dpf = time.perf_counter()
    tok = choose(-1)
    t_end = time.perf_counter()
    history = list(prompt) + [tok]
    emitted = 1
    # the prefill's own decode is its "verify"; the drafter's begin() is its "draft"
    yield StepRecord(
        step=0, mode="prefill", k=0, drafted=0, accepted=0, outcomes=[], draft=[], m=rows,
        draft_ms=(t_dpf - t_pf) * 1e3, verify_ms=(t_pf - t_start) * 1e3, accept_ms=(t_end - t_dpf) * 1e3,
        tokens=[tok], from_draft=[False], t_ms=(t_end - t_start) * 1e3,
    )
    def stops(t: int) -> bool:
        return (stop_at_eog and engine.is_eog(t)) or t in stop_tokens

    done = stops(tok)
    step = 0
    while not done and emitted < max_tokens:
        step += 1
        mode = "plain"
        kk = 0
        if k > 0:
            if gate is None or gate.open:
                mode, kk = "spec", k
            elif gate.wants_probe():
                mode, kk = "probe", k
        kk = min(kk, max_tokens - emitted)  # never verify rows that cannot be emitted
        t0 = time.perf_counter()
        draft = drafter.propose(history, kk, temperature=temperature, rng=rng) if kk > 0 else Draft([])
        d = draft.tokens[:kk]
        choice = None
        if policy is not None:  # the choice's own time counts as drafting
            t_d = time.perf_counter()
            choice = policy.choose(policy.assess(drafter, draft), draft_ms=(t_d - t0) * 1e3) if d else None
            d = d[: choice.j] if choice else []
            mode = "spec" if d else "plain"
        t1 = time.perf_counter()
        base = engine.n_past
        engine.decode([history[-1], *d], all_logits=True)
        t2 = time.perf_counter()
        out, outcomes, n_acc = accept_drafts(d, draft.q[: len(d)] if draft.q else draft.q, greedy=greedy, argmax=engine.argmax, logits=engine.logits,
                                             temperature=temperature, rng=rng)
        if n_acc == len(d):
            out.append(choose(len(d)))  # the bonus row after the last accepted draft
        # cache now holds t_last + all d; keep t_last + accepted drafts
        engine.rollback(base + 1 + n_acc)
        from_draft = [True] * n_acc + [False]
        for i, t in enumerate(out):
            if stops(t):
                out, from_draft, done = out[: i + 1], from_draft[: i + 1], True
                break
        if emitted + len(out) > max_tokens:
            out, from_draft = out[: max_tokens - emitted], from_draft[: max_tokens - emitted]
        history.extend(out)
        emitted += len(out)
        t3 = time.perf_counter()
        rec = StepRecord(
            step=step, mode=mode, k=kk, drafted=len(d), accepted=n_acc, outcomes=outcomes, draft=list(d),
            m=len(d) + 1, draft_ms=(t1 - t0) * 1e3, verify_ms=(t2 - t1) * 1e3, accept_ms=(t3 - t2) * 1e3,
            tokens=out, from_draft=from_draft, t_ms=(t3 - t_start) * 1e3,
        )
        if gate is not None and k > 0:
            rec.gate = gate.update(rec)
        if policy is not None:
            record_choice(policy, rec, choice)
        yield rec


def check_policy_args(policy: Policy | None, k: int, gate, *, has_drafter: bool) -> int:
    """The draft length a loop proposes at: k, or the policy's k_max (k must then be 0 or k_max)."""
    if policy is None:
        return k
    if not has_drafter:
        raise LabkitError("a draft length policy needs a drafter", "pass a drafter (ngram, model, mtp) with the policy")
    if k not in (0, policy.k_max):
        raise LabkitError(f"k = {k} and a policy with k_max = {policy.k_max}",
                          "pass k = 0 (or k_max) with a policy: it chooses each step's draft length itself")
    if gate is not None:
        raise LabkitError("an acceptance gate and a draft length policy both given",
                          "drop the gate: the policy drafts nothing (j = 0) when the evidence does not pay")
    return policy.k_max


def record_choice(policy: Policy, rec: StepRecord, choice) -> None:
    """Put the policy's decision on the record and let the policy learn from its outcome."""
    if choice is None:  # nothing proposed (no match, or no room left): a plain step
        choice = Choice(j=0, pred=[], bins=[])
    rec.policy_j, rec.policy_pred, rec.policy_bins = choice.j, choice.pred[: choice.j], choice.bins[: choice.j]
    policy.observe(choice, rec.outcomes, accept_ms=rec.accept_ms)


def run(engine, prompt: Sequence[int], **kw) -> list[StepRecord]:
    """All records of one generation (see :func:`generate`)."""
    return list(generate(engine, prompt, **kw))


def tokens_of(records: Sequence[StepRecord]) -> list[int]:
    return [t for r in records for t in r.tokens]
