"""Draft length policies: how many of a proposal's tokens to verify, chosen per step.

A fixed k drafts on every step, including the steps where the drafter's evidence is
weak; on a box where verify(2) costs ~2× the plain step, that is what makes a k = 1
draft accepted 89% of the time lose end to end. The priced policy asks, at every step
and for every candidate j = 0..k_max (j = 0 is a plain step):

    E[j]    = 1 + sum_{i<j} prod_{l<=i} p_l          expected tokens of the step
    cost(j) = D + V(j+1) + O(j)                      ms: the draft (already spent this
                                                     step, the same for every j), the
                                                     box's measured verify(m) (odd m
                                                     dearer), the loop's own overhead
    j*      = argmax_j E[j] / cost(j)                 tokens per ms; j = 0 when nothing
                                                     beats a plain step

p_l is the conditional acceptance of draft position l predicted from the drafter's own
evidence for *this* proposal (n-gram: match length and how often the continuation was
seen; a draft model or MTP head: the probability it gave the token), mapped to a
probability online in three stages, each shrunk towards the one before:

1. per (position, evidence bin), towards the running acceptance of that position (which
   starts from a sweep's profile when one is given);
2. per (position, evidence bin, the stream's last drafted step: ``hot`` when all of it
   was accepted, ``cold`` when a draft was rejected): copied spans come in runs, and
   the same evidence is worth more inside one;
3. a recalibration: the mean (outcome - prediction) of stage 2's predictions in the same
   tenth, added back in proportion to its samples, so a bias the tables share (the
   evidence says more than it is worth on this workload) is taken out.

Every count fades once a cell holds ``CELL_CAP`` outcomes (``RECAL_CAP`` for stage 3),
so the tables follow a change of workload within a few dozen steps instead of carrying
another workload's rates. At c > 1 streams one decode holds every stream's rows, so the batch is
priced as a whole: sum of E over streams / (V(all rows) + drafts + overheads), chosen
by coordinate ascent over the streams' j; as V(rows) grows with the batch, a draft must
carry more evidence to pay, so the policy drafts less.

The policy only chooses j and learns from the outcomes; acceptance is the loop's own
rule (``sampling.accept_drafts``), so greedy output stays identical to plain decoding
and sampled output keeps the target's distribution. Policies are registered like
drafters (``register(name, factory)``; a factory is
``(recipe, drafter, verify, *, batch_verify, profile) -> Policy``).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace

import numpy as np

from labkit.decoding.drafters.base import Draft, Drafter
from labkit.errors import LabkitError

DEFAULT_K_MAX = 8
PRIOR_WEIGHT = 4.0  # pseudo-observations behind a prior (a bin's centre, a position's profile)
P_FLOOR, P_CEIL = 0.01, 0.99
# a table cell's counts fade (scaled down) once it holds this many outcomes: the learned rates
# follow the workload in front of the policy, not the one before it. Chosen by replaying the
# policy on the default recipe's own prompts (greedy: a draft is accepted iff plain emits it),
# not on the held-out sets of benchmarks/bench_policy.py
CELL_CAP = 100.0
RECAL_WEIGHT = 30.0  # pseudo-observations behind "no correction" in the recalibration stage
RECAL_CAP = 200.0
CONTEXTS = ("none", "hot", "cold")  # the stream's last drafted step: none yet, all accepted, a rejection


def _tenth(p: float) -> int:
    """The recalibration's cell of a prediction: its tenth, 0..9."""
    return min(9, int(p * 10))


def _add(cell, o: float, cap: float) -> None:
    """Add one outcome to [sum, count], scaling the old ones down once the count reaches cap."""
    if cell[1] >= cap:
        f = (cap - 1.0) / cell[1]
        cell[0] *= f
        cell[1] *= f
    cell[0] += o
    cell[1] += 1.0


def evidence_bin(ev: dict) -> tuple[str, float]:
    """A drafter's evidence for one position -> (bin label, prior acceptance).

    n-gram: ``n<match>:<support>`` where support says how often the n tokens before the
    position were followed by the drafted token (``1x``: seen once; ``all``; ``most``
    >= half; ``few``); prior (seen + 0.5)/(total + 1). A probability ``p`` (draft model,
    MTP head): its decile, prior p itself.
    """
    if "p" in ev:
        p = float(ev["p"])
        return f"p{min(9, int(p * 10))}", p
    seen, total = int(ev["seen"]), int(ev["total"])
    sup = "1x" if total <= 1 else "all" if seen >= total else "most" if 2 * seen >= total else "few"
    return f"n{ev['n']}:{sup}", (seen + 0.5) / (total + 1)


def expected_tokens(p: Sequence[float]) -> np.ndarray:
    """E[j] for j = 0..len(p): 1 + the expected accepted prefix of the first j drafts."""
    return 1.0 + np.concatenate([[0.0], np.cumsum(np.cumprod(np.asarray(p, dtype=float)))])


@dataclass
class Choice:
    """One stream's decision at one step: j, and the prediction behind it."""

    j: int
    pred: list[float]  # predicted conditional acceptance per proposed position
    bins: list[str]  # evidence bin per proposed position
    expected: float = 1.0  # E[j]
    opt: list[float] | None = None  # optimistic acceptance the choice used (exploration); None: pred
    raw: list[float] | None = None  # stage 2's prediction, before recalibration; None: not recalibrated
    context: str = "none"  # the stream's last drafted step when it was assessed (CONTEXTS)
    stream: int | None = None  # which stream (its drafter): the context is kept per stream


class Policy:
    """A draft length policy: ``assess`` a proposal, ``choose`` j, ``observe`` the outcome."""

    name = "base"
    k_max: int = DEFAULT_K_MAX

    def assess(self, drafter: Drafter, draft: Draft) -> Choice:
        raise NotImplementedError

    def choose(self, choice: Choice, *, draft_ms: float = 0.0) -> Choice:
        return self.choose_batch([choice], draft_ms=[draft_ms])[0]

    def choose_batch(self, choices: list[Choice], *, draft_ms: Sequence[float]) -> list[Choice]:
        raise NotImplementedError

    def observe(self, choice: Choice, outcomes: Sequence[int], *, accept_ms: float | None = None) -> None:
        """Learn from one step's outcomes (1 accepted, 0 rejected, -1 not tested)."""

    def describe(self) -> dict:
        return {"policy": self.name, "k_max": self.k_max}


@dataclass
class PricedPolicy(Policy):
    """Tokens per ms from the drafter's evidence and the box's measured verify(m).

    ``verify``: this box's single-stream verify model (anything with ``H`` and ``V(m)``,
    e.g. ``analysis.costmodel.VerifyModel``); ``batch_verify``: the same over the rows of
    a shared decode (``analysis.batchcost.fit``), used when more than one stream decodes.
    ``profile``: acceptance per position from the last sweep (``costmodel.acceptance_profile``'s
    ``alpha``), the starting point of the running per-position acceptance.
    ``overhead``: (o0, o1) ms of loop bookkeeping per step and per extra row; None learns
    it online from the records' ``accept_ms``.
    """

    verify: object
    k_max: int = DEFAULT_K_MAX
    batch_verify: object | None = None
    profile: Sequence[float] | None = None
    overhead: tuple[float, float] | None = None
    drafter_name: str = ""
    # exploration: choose with pred + explore·sd(pred) (sd of the bin's posterior), so a bin
    # that was never drafted still gets tried until its own outcomes say what it is worth
    explore: float = 1.0
    cell_cap: float = CELL_CAP  # a cell's counts fade past this many outcomes (module docstring)
    name: str = "priced"
    _pos: np.ndarray = field(default=None, repr=False)  # (k_max, 2): accepted, tested per position
    _bins: dict = field(default_factory=dict, repr=False)  # (position, bin) -> [accepted, tested]
    _ctx: dict = field(default_factory=dict, repr=False)  # (position, bin, context) -> [accepted, tested]
    _recal: dict = field(default_factory=dict, repr=False)  # tenth of the raw prediction -> [sum(o - p), n]
    _last: dict = field(default_factory=dict, repr=False)  # stream -> its context
    _ovh: list = field(default_factory=lambda: [0.0, 0.0, 0, 0], repr=False)  # o0, o1, n0, n1
    _vcache: dict = field(default_factory=dict, repr=False)  # (single|batch, rows) -> ms: V is numpy, slow per call

    def __post_init__(self):
        check_k_max(self.k_max)
        check_verify(self.verify, self.k_max + 1, what="verify")
        if self.batch_verify is not None:
            check_verify(self.batch_verify, 2, what="batch_verify")
        self._pos = np.zeros((self.k_max, 2))

    # -- prediction ------------------------------------------------------------------
    def _position_rate(self, i: int, prior: float) -> float:
        """Running acceptance of position i, starting from the profile, else from the
        position before it (a deeper position is seldom tried before a shallower one is
        known: borrowing lets a stream of accepted drafts reach long drafts), else ``prior``."""
        acc, n = self._pos[i]
        if self.profile is not None and i < len(self.profile):
            start = float(self.profile[i])
        elif i > 0:
            start = self._position_rate(i - 1, prior)
        else:
            start = prior
        return (acc + PRIOR_WEIGHT * start) / (n + PRIOR_WEIGHT)

    def _raw(self, evidence: Sequence[dict], context: str) -> tuple[list[float], list[str]]:
        """Stages 1 and 2 (module docstring): per (position, bin), then per context."""
        raw, bins = [], []
        for i, ev in enumerate(evidence[: self.k_max]):
            b, prior = evidence_bin(ev)
            centre = 0.5 * (prior + self._position_rate(i, prior))
            acc, n = self._bins.get((i, b), (0.0, 0.0))
            p = (acc + PRIOR_WEIGHT * centre) / (n + PRIOR_WEIGHT)
            acc, n = self._ctx.get((i, b, context), (0.0, 0.0))
            p = (acc + PRIOR_WEIGHT * p) / (n + PRIOR_WEIGHT)
            raw.append(float(min(P_CEIL, max(P_FLOOR, p))))
            bins.append(b)
        return raw, bins

    def _recalibrate(self, raw: Sequence[float]) -> list[float]:
        """Stage 3: raw + the mean error of raw predictions in its tenth, shrunk by RECAL_WEIGHT."""
        out = []
        for p in raw:
            s, n = self._recal.get(_tenth(p), (0.0, 0.0))
            out.append(float(min(P_CEIL, max(P_FLOOR, p + s / (n + RECAL_WEIGHT)))))
        return out

    def predict(self, evidence: Sequence[dict], context: str = "none") -> tuple[list[float], list[str]]:
        """Predicted conditional acceptance and evidence bin per position, for a stream whose
        last drafted step was ``context``."""
        raw, bins = self._raw(evidence, context)
        return self._recalibrate(raw), bins

    def assess(self, drafter: Drafter, draft: Draft) -> Choice:
        ev = drafter.evidence(draft)[: len(draft.tokens)]
        stream = id(drafter)  # one drafter per stream (the loop's, or each multi-slot stream's)
        context = self._last.get(stream, "none")
        raw, bins = self._raw(ev, context)
        pred = self._recalibrate(raw)
        return Choice(j=0, pred=pred, bins=bins, opt=self.optimistic(pred, bins, context), raw=raw,
                      context=context, stream=stream)

    def optimistic(self, pred: Sequence[float], bins: Sequence[str], context: str = "none") -> list[float]:
        """pred + explore × the posterior sd of each position's bin in this context (shrinks
        with its samples)."""
        out = []
        for i, (p, b) in enumerate(zip(pred, bins, strict=True)):
            n = self._ctx.get((i, b, context), (0.0, 0.0))[1]
            out.append(float(min(P_CEIL, p + self.explore * np.sqrt(p * (1 - p) / (n + PRIOR_WEIGHT)))))
        return out

    # -- pricing ---------------------------------------------------------------------
    def _o(self, j: int) -> float:
        if self.overhead is not None:
            return self.overhead[0] + self.overhead[1] * j
        return self._ovh[0] + self._ovh[1] * j

    def step_ms(self, js: Sequence[int], *, draft_ms: Sequence[float]) -> float:
        """Expected ms of one shared step whose streams verify js drafts each."""
        rows = sum(1 + j for j in js)
        batch = len(js) > 1 and self.batch_verify is not None
        v = self._vcache.get((batch, rows))
        if v is None:
            v = self._vcache[(batch, rows)] = float((self.batch_verify if batch else self.verify).V(rows))
        return v + float(sum(draft_ms)) + sum(self._o(j) for j in js)

    def choose_batch(self, choices: list[Choice], *, draft_ms: Sequence[float]) -> list[Choice]:
        """j per stream maximising the step's expected tokens per ms (coordinate ascent
        from all-plain; one stream is an exact search over its j)."""
        E = [expected_tokens(c.opt if c.opt is not None else c.pred) for c in choices]
        js = [0] * len(choices)

        def rate(js_) -> float:
            return sum(e[j] for e, j in zip(E, js_, strict=True)) / self.step_ms(js_, draft_ms=draft_ms)

        for _ in range(2 if len(choices) > 1 else 1):
            changed = False
            for s, e in enumerate(E):
                best_j, best = js[s], rate(js)
                for j in range(len(e)):
                    trial = js[:s] + [j] + js[s + 1 :]
                    r = rate(trial)
                    if r > best * (1 + 1e-9):
                        best_j, best = j, r
                changed |= best_j != js[s]
                js[s] = best_j
            if not changed:
                break
        return [replace(c, j=j, expected=float(e[j])) for c, e, j in zip(choices, E, js, strict=True)]

    # -- learning --------------------------------------------------------------------
    def observe(self, choice: Choice, outcomes: Sequence[int], *, accept_ms: float | None = None) -> None:
        for i, o in enumerate(outcomes[: choice.j]):
            if o < 0:
                break  # not tested: after the first rejection
            _add(self._pos[i], o, self.cell_cap)
            _add(self._bins.setdefault((i, choice.bins[i]), [0.0, 0.0]), o, self.cell_cap)
            _add(self._ctx.setdefault((i, choice.bins[i], choice.context), [0.0, 0.0]), o, self.cell_cap)
            if choice.raw is not None:
                _add(self._recal.setdefault(_tenth(choice.raw[i]), [0.0, 0.0]), o - choice.raw[i], RECAL_CAP)
        if choice.j > 0 and choice.stream is not None:
            self._last[choice.stream] = "hot" if all(o == 1 for o in outcomes[: choice.j]) else "cold"
        if accept_ms is not None and self.overhead is None:
            o0, o1, n0, n1 = self._ovh
            if choice.j == 0:
                n0 += 1
                o0 += (accept_ms - o0) / n0
            else:
                n1 += 1
                o1 += (max(0.0, accept_ms - o0) / choice.j - o1) / n1
            self._ovh = [o0, o1, n0, n1]

    def table(self) -> list[dict]:
        """The learned evidence -> acceptance table: one row per (position, bin), counts as
        they stand (faded past CELL_CAP)."""
        return [{"position": i, "bin": b, "accepted": a, "tested": n, "rate": a / n if n else None}
                for (i, b), (a, n) in sorted(self._bins.items())]

    def recalibration(self) -> list[dict]:
        """Stage 3 as it stands: per tenth of the raw prediction, the mean error and its weight."""
        return [{"tenth": d, "mean_error": s / n if n else None, "n": n, "correction": s / (n + RECAL_WEIGHT)}
                for d, (s, n) in sorted(self._recal.items())]

    def describe(self) -> dict:
        return {"policy": self.name, "k_max": self.k_max, "drafter": self.drafter_name,
                "H_ms": float(self.verify.H), "V_ms": [float(self.verify.V(m)) for m in range(1, self.k_max + 2)],
                "batch_verify": self.batch_verify is not None, "explore": self.explore, "profile": list(self.profile or []),
                "cell_cap": self.cell_cap, "recal_weight": RECAL_WEIGHT,
                "overhead_ms": list(self.overhead) if self.overhead is not None else self._ovh[:2]}


def check_k_max(k_max) -> None:
    if not isinstance(k_max, int) or isinstance(k_max, bool) or k_max < 1:
        raise LabkitError(f"policy k_max = {k_max!r}: the longest draft the policy may choose must be >= 1",
                          "set policy_k_max >= 1 (e.g. 8; j = 0, a plain step, is always a candidate), "
                          "or use a fixed k: 0 for plain decoding")


def check_verify(vm, m_needed: int, *, what: str) -> None:
    """A verify model must price every row count the policy may ask for."""
    if vm is None or not hasattr(vm, "V") or not hasattr(vm, "H"):
        raise LabkitError(f"the priced policy has no {what} model for this host and build",
                          "measure one first (`labkit bench verify`, or bench spec --k auto measures it), "
                          "or set policy_verify: measure in the recipe")
    ms = np.asarray([float(vm.V(m)) for m in range(1, m_needed + 1)])
    if not np.all(np.isfinite(ms)) or np.any(ms <= 0):
        raise LabkitError(f"the {what} model prices some m in 1..{m_needed} at {ms.round(2).tolist()} ms",
                          "re-measure verify(m) (`labkit bench verify --m 1-9`) on this box")
    fit = getattr(vm, "fit", None)
    seen = sorted((getattr(fit, "residual_by_m", None) or {}).keys())
    if seen and max(seen) < m_needed and what == "verify":
        raise LabkitError(f"the verify model was measured up to m = {max(seen)} but the policy may verify "
                          f"m = {m_needed} (k_max + 1)",
                          f"measure verify(m) up to {m_needed} (`labkit bench verify --m 1-{m_needed}`) "
                          f"or lower policy_k_max to {max(seen) - 1}")


# -- the registry ----------------------------------------------------------------------
Factory = Callable[..., Policy]


@dataclass(frozen=True)
class PolicySpec:
    name: str
    factory: Factory
    help: str = ""


POLICIES: dict[str, PolicySpec] = {}


def register(name: str, factory: Factory, *, help: str = "") -> None:
    POLICIES[name] = PolicySpec(name, factory, help)


def names() -> list[str]:
    return sorted(POLICIES)


def get(name: str) -> PolicySpec:
    if name not in POLICIES:
        raise LabkitError(f"unknown draft length policy {name!r}", f"use one of {names()}")
    return POLICIES[name]


def make(name: str, *, k_max: int, drafter: Drafter, verify, **kw) -> Policy:
    """A policy for ``drafter`` (it is told to record its evidence)."""
    pol = get(name).factory(k_max=k_max, drafter=drafter, verify=verify, **kw)
    drafter.collect_evidence = True
    return pol


def _priced(*, k_max, drafter, verify, batch_verify=None, profile=None, overhead=None) -> Policy:
    return PricedPolicy(verify=verify, k_max=k_max, batch_verify=batch_verify, profile=profile, overhead=overhead,
                        drafter_name=drafter.name)


register("priced", _priced, help="per step, the j that maximises expected tokens per ms on the measured verify(m)")
