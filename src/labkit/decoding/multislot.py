"""Multi-slot decoding: c streams share every target decode (continuous batching).

The single-stream loop (``decoding.loop``) prices speculation on a quiet box; a server
decodes c requests at once, and a batch that already holds c rows makes k more rows per
stream cost something different. This loop is the server's shape on labkit's parts:

    slots     c sequence ids of one llama.cpp context; a queue of requests refills a slot
              as soon as its stream finishes (closed loop: c clients, each sending its
              next request when the last one ends)
    admit     a new stream is prefilled on its own decode (its sequence only) and its
              drafter begins; its clock (``t_ms``) starts when it is admitted
    step      every active stream drafts (its own drafter, its own gate); ONE decode
              holds each stream's rows [t_last, d_1..d_k] on its sequence id; each
              stream accepts against its own rows and rolls back only its own sequence
    leave     a stream that stops (end of generation, a stop token, max_tokens) frees
              its slot (its sequence is emptied) for the next request

k = 0 is the same loop (plain continuous batching), so baseline and speculation are
timed identically. Each stream gets the same :class:`StepRecord` fields as the
single-stream loop, plus which shared decode it took part in, how many rows and streams
that decode held, and its time (``verify_ms`` is the shared decode's: what the stream
waited for). Greedy output per stream equals the stream's own single-stream output up to
batched-kernel near-ties (``analysis.lossless`` explains each divergence).
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field

import numpy as np

from labkit.decoding.drafters.base import Draft, Drafter
from labkit.decoding.gate import AcceptanceGate
from labkit.decoding.loop import check_policy_args, check_step_args, record_choice
from labkit.decoding.policy import Choice, Policy
from labkit.decoding.records import StepRecord
from labkit.decoding.sampling import accept_drafts, sample, softmax
from labkit.errors import LabkitError

DEFAULT_MAX_TOKENS = 128


@dataclass(kw_only=True)
class StreamRecord(StepRecord):
    """One step of one stream, with the shared decode it was part of."""

    stream: int  # index of the request in the queue
    slot: int  # sequence id it ran on
    batch_step: int  # index of the shared decode (-1: this stream's own prefill)
    batch_rows: int  # rows in that decode (all streams)
    batch_streams: int  # streams in that decode
    t_run_ms: float  # end of this step, ms since the run began (all streams share this clock)


@dataclass(frozen=True, kw_only=True)
class Request:
    """One generation request: token ids and its own limits."""

    prompt: Sequence[int]
    max_tokens: int = DEFAULT_MAX_TOKENS
    stop_tokens: frozenset[int] = frozenset()
    id: str = ""


@dataclass
class _Stream:
    index: int
    slot: int
    req: Request
    t0: float
    drafter: Drafter | None
    gate: AcceptanceGate | None
    rng: np.random.Generator
    history: list[int] = field(default_factory=list)
    emitted: int = 0
    step: int = 0
    done: bool = False
    # this step's draft
    mode: str = "plain"
    kk: int = 0
    draft: Draft | None = None
    draft_ms: float = 0.0
    choice: object = None  # the policy's decision this step (``decoding.policy.Choice``)


def generate_many(
    engine,
    requests: Sequence[Request],
    *,
    c: int,
    k: int = 0,
    make_drafter: Callable[[], Drafter] | None = None,
    temperature: float = 0.0,
    seed: int = 0,
    make_gate: Callable[[], AcceptanceGate | None] = lambda: None,
    stop_at_eog: bool = True,
    policy: Policy | None = None,
) -> Iterator[StreamRecord]:
    """Decode ``requests`` on ``c`` slots of ``engine``, yielding one record per stream step.

    ``make_drafter`` makes one drafter per slot (each stream's drafter state is its own;
    ``begin`` is called per request). Records of different streams interleave in the
    order they happen; group them by ``stream``. The engine's sequences are emptied
    before and after (``engine.seq_clear()``).
    ``policy`` (``decoding.policy``, one for all streams) chooses every stream's draft
    length together, pricing the shared decode's rows (its ``batch_verify``).
    """
    if c < 1:
        raise LabkitError(f"c = {c}", "use c >= 1 concurrent streams")
    k = check_policy_args(policy, k, make_gate(), has_drafter=make_drafter is not None)
    check_step_args(k, temperature, has_drafter=make_drafter is not None, drafter_hint="pass a drafter factory")
    if c > getattr(engine, "n_seq_max", 1):
        raise LabkitError(f"c = {c} streams but the engine holds {getattr(engine, 'n_seq_max', 1)} sequences",
                          "open the engine with n_seq_max >= c (labkit opens it for the largest c asked)")
    for i, r in enumerate(requests):
        if not r.prompt:
            raise LabkitError(f"request {i} has an empty prompt", "give at least one token")
        if len(r.prompt) + r.max_tokens + k > engine.n_ctx:
            raise LabkitError(f"request {i} needs {len(r.prompt) + r.max_tokens + k} positions but a sequence "
                              f"holds {engine.n_ctx}", "shorten the prompt or max_tokens, or raise n_ctx")
    greedy = temperature == 0.0
    drafters = [make_drafter() for _ in range(c)] if k > 0 else [None] * c
    if policy is not None:
        for d in drafters:
            d.collect_evidence = True
    queue = deque(enumerate(requests))
    slots: list[_Stream | None] = [None] * c
    engine.seq_clear()
    t_run = time.perf_counter()
    batch_step = 0

    def stops(st: _Stream, t: int) -> bool:
        return (stop_at_eog and engine.is_eog(t)) or t in st.req.stop_tokens

    def choose(st: _Stream, row: int, top: np.ndarray | None) -> int:
        if greedy:
            return int(top[row]) if top is not None else engine.argmax(row)
        return sample(softmax(engine.logits(row), temperature), st.rng)

    def leave(st: _Stream) -> None:
        st.done = True
        engine.seq_rollback(st.slot, 0)
        slots[st.slot] = None

    try:
        while queue or any(s is not None for s in slots):
            # -- admit: every free slot takes the next request (its own prefill decode)
            for s in range(c):
                if slots[s] is not None or not queue:
                    continue
                idx, req = queue.popleft()
                st = _Stream(index=idx, slot=s, req=req, t0=time.perf_counter(), drafter=drafters[s],
                             gate=make_gate() if k > 0 else None, rng=np.random.default_rng([seed, idx]))
                slots[s] = st
                rows = engine.seq_prefill(s, req.prompt)
                t_pf = time.perf_counter()
                if st.drafter is not None:
                    st.drafter.begin(req.prompt)
                t_dpf = time.perf_counter()
                tok = choose(st, -1, None)
                t_end = time.perf_counter()
                st.history = [*req.prompt, tok]
                st.emitted = 1
                yield StreamRecord(
                    step=0, mode="prefill", k=0, drafted=0, accepted=0, outcomes=[], draft=[], m=rows,
                    draft_ms=(t_dpf - t_pf) * 1e3, verify_ms=(t_pf - st.t0) * 1e3, accept_ms=(t_end - t_dpf) * 1e3,
                    tokens=[tok], from_draft=[False], t_ms=(t_end - st.t0) * 1e3, stream=idx, slot=s,
                    batch_step=-1, batch_rows=rows, batch_streams=1, t_run_ms=(t_end - t_run) * 1e3,
                )
                if stops(st, tok) or st.emitted >= req.max_tokens:
                    leave(st)
            active = [st for st in slots if st is not None]
            if not active:
                continue
            # -- draft: each stream on its own
            for st in active:
                st.step += 1
                st.mode, st.kk = "plain", 0
                if k > 0:
                    if st.gate is None or st.gate.open:
                        st.mode, st.kk = "spec", k
                    elif st.gate.wants_probe():
                        st.mode, st.kk = "probe", k
                st.kk = min(st.kk, st.req.max_tokens - st.emitted)
                t0 = time.perf_counter()
                d = st.drafter.propose(st.history, st.kk, temperature=temperature, rng=st.rng) if st.kk else None
                st.draft = Draft(d.tokens[: st.kk], q=d.q, info=d.info) if d is not None else Draft([])
                st.draft_ms = (time.perf_counter() - t0) * 1e3
            if policy is not None:  # one choice for the whole batch, its time shared as drafting
                t0 = time.perf_counter()
                chosen = policy.choose_batch(
                    [policy.assess(st.drafter, st.draft) if st.draft.tokens else Choice(j=0, pred=[], bins=[])
                     for st in active], draft_ms=[st.draft_ms for st in active])
                for st, ch in zip(active, chosen, strict=True):
                    st.choice = ch
                    st.draft = Draft(st.draft.tokens[: ch.j], q=st.draft.q[: ch.j] if st.draft.q else None)
                    st.mode = "spec" if ch.j else "plain"
                share = (time.perf_counter() - t0) * 1e3 / len(active)
                for st in active:
                    st.draft_ms += share
            # -- verify: one decode for all streams
            parts = [(st.slot, [st.history[-1], *st.draft.tokens]) for st in active]
            bases = [engine.seq_n_past[st.slot] for st in active]
            t1 = time.perf_counter()
            offsets = engine.decode_seqs(parts)
            t2 = time.perf_counter()
            n_rows = sum(len(p[1]) for p in parts)
            top = engine.argmax_rows(n_rows) if greedy else None
            verify_ms = (t2 - t1) * 1e3
            # -- accept: each stream against its own rows, rolling back its own sequence
            for st, off, base in zip(active, offsets, bases, strict=True):
                ta = time.perf_counter()
                d = st.draft.tokens
                out, outcomes, n_acc = accept_drafts(
                    d, st.draft.q, greedy=greedy, argmax=lambda j, off=off, top=top: top[off + j],
                    logits=lambda j, off=off: engine.logits(off + j), temperature=temperature, rng=st.rng)
                if n_acc == len(d):
                    out.append(choose(st, off + len(d), top))
                engine.seq_rollback(st.slot, base + 1 + n_acc)
                from_draft = [True] * n_acc + [False]
                finished = False
                for i, t in enumerate(out):
                    if stops(st, t):
                        out, from_draft, finished = out[: i + 1], from_draft[: i + 1], True
                        break
                room = st.req.max_tokens - st.emitted
                if len(out) >= room:
                    out, from_draft, finished = out[:room], from_draft[:room], True
                st.history.extend(out)
                st.emitted += len(out)
                t3 = time.perf_counter()
                rec = StreamRecord(
                    step=st.step, mode=st.mode, k=st.kk, drafted=len(d), accepted=n_acc, outcomes=outcomes,
                    draft=list(d), m=len(d) + 1, draft_ms=st.draft_ms, verify_ms=verify_ms,
                    accept_ms=(t3 - ta) * 1e3, tokens=out, from_draft=from_draft, t_ms=(t3 - st.t0) * 1e3,
                    stream=st.index, slot=st.slot, batch_step=batch_step, batch_rows=n_rows,
                    batch_streams=len(active), t_run_ms=(t3 - t_run) * 1e3,
                )
                if st.gate is not None:
                    rec.gate = st.gate.update(rec)
                if policy is not None:
                    record_choice(policy, rec, st.choice)
                if finished:
                    leave(st)
                yield rec
            batch_step += 1
    finally:
        engine.seq_clear()
        for d in drafters:
            if d is not None:
                d.close()


def run_many(engine, requests: Sequence[Request], **kw) -> list[StreamRecord]:
    """All records of one multi-slot run (see :func:`generate_many`)."""
    return list(generate_many(engine, requests, **kw))


def by_stream(records: Sequence[StreamRecord]) -> dict[int, list[StreamRecord]]:
    """Records grouped per stream (request index), each in step order."""
    out: dict[int, list[StreamRecord]] = {}
    for r in records:
        out.setdefault(r.stream, []).append(r)
    return dict(sorted(out.items()))
