"""The speculative loop: lossless greedy output, record invariants, the gate, bad input."""

from __future__ import annotations

import pytest

from labkit.analysis.lossless import divergence_report, verify_oracle
from labkit.analysis.stats import summarize
from labkit.decoding.drafters.base import Draft, Drafter
from labkit.decoding.drafters.model import ModelDrafter
from labkit.decoding.drafters.ngram import NgramDrafter
from labkit.decoding.gate import AcceptanceGate
from labkit.decoding.loop import run, tokens_of
from labkit.errors import LabkitError
from labkit.suites.workloads import WORKLOADS, load_workload

MAX = 40


def check_records(recs, k):
    assert recs[0].mode == "prefill" and len(recs[0].tokens) == 1
    for r in recs[1:]:
        assert r.m == r.drafted + 1
        assert r.drafted <= r.k <= k
        assert r.accepted == sum(1 for o in r.outcomes if o == 1)
        assert len(r.draft) == r.drafted and r.tokens[: r.accepted] == r.draft[: r.accepted]
        # accepted positions form a prefix, then at most one rejection, then untested
        acc = r.outcomes[: r.accepted]
        rest = r.outcomes[r.accepted :]
        assert all(o == 1 for o in acc)
        assert rest == [] or (rest[0] == 0 and all(o == -1 for o in rest[1:]))
        assert sum(r.from_draft) <= r.accepted
        assert 1 <= len(r.tokens) <= r.accepted + 1
        assert r.verify_ms > 0
    assert sum(len(r.tokens) for r in recs) <= MAX
    assert all(a.t_ms <= b.t_ms for a, b in zip(recs, recs[1:]))


def assert_lossless(engine, ids, plain, spec):
    """The exact oracle at every step (each accepted draft is the argmax of its verify
    row, replayed), then identical output or a divergence explained by a near-tie."""
    assert verify_oracle(engine, ids, spec) == []
    rep = divergence_report(engine, ids, plain, spec)
    assert rep["lossless"], rep
    if not rep["identical"]:
        d = rep["divergence"]
        assert d["near_tie"] and 0 <= d["plain_gap"] <= d["near_tie_band"] <= 1.5
        assert d["spec_gap"] >= 0  # the speculative row really preferred its token


@pytest.mark.parametrize("workload", WORKLOADS)
def test_ngram_is_lossless_on_every_workload(engine, workload):
    ids = engine.tokenize(load_workload(workload)[0].text)
    plain = run(engine, ids, max_tokens=MAX)
    recs = run(engine, ids, drafter=NgramDrafter(), k=4, max_tokens=MAX)
    check_records(recs, 4)
    assert_lossless(engine, ids, plain, recs)


@pytest.mark.parametrize("workload", WORKLOADS)
@pytest.mark.slow
def test_draft_model_is_lossless_on_every_workload(engine, draft_engine, workload):
    ids = engine.tokenize(load_workload(workload)[1].text)
    plain = run(engine, ids, max_tokens=MAX)
    drafter = ModelDrafter(draft_engine, target=engine)
    recs = run(engine, ids, drafter=drafter, k=3, max_tokens=MAX)
    check_records(recs, 3)
    assert all(r.draft_ms > 0 for r in recs[1:] if r.drafted)
    assert_lossless(engine, ids, plain, recs)


@pytest.mark.slow
def test_edit_workload_accepts_most_ngram_drafts(engine):
    ids = engine.tokenize(load_workload("edit")[0].text)
    s = summarize(run(engine, ids, drafter=NgramDrafter(), k=4, max_tokens=96))
    assert s.drafted > 20
    assert s.acceptance > 0.6  # the model copies the passage: lookups mostly hit
    assert s.tokens_per_step > 1.5


class JunkDrafter(Drafter):
    """Proposes tokens the target never picks: drives acceptance to ~0 to exercise the gate."""

    name = "junk"

    def propose(self, history, k, *, temperature=0.0, rng=None):
        return Draft([262000 + i for i in range(k)])


def test_gate_falls_back_to_plain_and_reprobes(engine):
    ids = engine.tokenize("Once upon a time")
    gate = AcceptanceGate(threshold=0.6, window=8, min_samples=8, probe_every=6)
    recs = run(engine, ids, drafter=JunkDrafter(), k=2, max_tokens=MAX, gate=gate)
    modes = [r.mode for r in recs]
    events = [r.gate for r in recs if r.gate]
    assert events and events[0].startswith("closed: rolling acceptance 0.00 < 0.60")
    first_plain = modes.index("plain")
    assert all(m == "spec" for m in modes[1:first_plain])
    assert "probe" in modes[first_plain:]
    # output still equals plain greedy output
    assert tokens_of(recs) == tokens_of(run(engine, ids, max_tokens=MAX))


@pytest.mark.slow
def test_gate_threshold_is_resolved_at_the_boundary_and_recorded(monkeypatch):
    """$AS_SPEC_MIN_ACCEPT sets the recipe's gate once, when the recipe is resolved; the
    loop never reads the environment, and the value's origin goes into provenance."""
    from labkit.config.recipe import load, resolve
    from labkit.provenance import fingerprint, runtags

    monkeypatch.setenv("AS_SPEC_MIN_ACCEPT", "0.3")
    r = resolve(load("default"))
    assert r.gate == 0.3 and r.origin_of("gate") == "env AS_SPEC_MIN_ACCEPT=0.3"
    assert r.hash != load("default").hash  # the effective value is part of the recipe hash
    tags = runtags.flat_tags(fingerprint.collect(recipe=r))
    assert tags["gate.threshold"] == 0.3 and tags["gate.source"] == "env AS_SPEC_MIN_ACCEPT=0.3"
    over = resolve(load("default"), {"gate": 0.8}, origin="--gate")
    assert over.gate == 0.8 and over.origin_of("gate") == "--gate"  # an explicit flag wins
    monkeypatch.setenv("AS_SPEC_MIN_ACCEPT", "lots")
    with pytest.raises(LabkitError, match="AS_SPEC_MIN_ACCEPT"):
        resolve(load("default"))
    monkeypatch.delenv("AS_SPEC_MIN_ACCEPT")
    plain = resolve(load("default"))
    assert plain.gate == 0.6 and plain.origin_of("gate").startswith("recipe file")
    # the loop's gate does not look at the environment
    monkeypatch.setenv("AS_SPEC_MIN_ACCEPT", "0.1")
    assert AcceptanceGate().threshold == 0.6
    with pytest.raises(LabkitError, match="outside"):
        AcceptanceGate(threshold=1.5)


@pytest.mark.slow
def test_gate_stays_open_when_drafts_are_accepted(engine):
    ids = engine.tokenize(load_workload("edit")[0].text)
    recs = run(engine, ids, drafter=NgramDrafter(), k=3, max_tokens=MAX, gate=AcceptanceGate(threshold=0.1))
    assert not any(r.gate for r in recs)
    assert all(r.mode == "spec" for r in recs[1:])


def test_bad_input(engine):
    ids = engine.tokenize("Hello")
    with pytest.raises(LabkitError, match="negative"):
        run(engine, ids, drafter=NgramDrafter(), k=-1)
    with pytest.raises(LabkitError, match="needs a drafter"):
        run(engine, ids, k=2)
    with pytest.raises(LabkitError, match="empty"):
        run(engine, [], max_tokens=4)
    with pytest.raises(LabkitError, match="raise n_ctx"):
        run(engine, ids * 2000, max_tokens=4)


def test_draft_model_with_another_vocabulary_is_refused(engine, tmp_path):
    from labkit.artifacts import synthetic
    from labkit.engines.llamacpp import LlamaCppEngine

    path = tmp_path / "dense.gguf"
    synthetic.write("synthetic-dense", path)
    other = LlamaCppEngine(path, n_ctx=256, n_threads=2)
    with pytest.raises(LabkitError, match="vocabulary"):
        ModelDrafter(other, target=engine)
    other.close()


def test_verify_oracle_catches_a_wrongly_accepted_draft(engine):
    """The oracle can fail: a record whose accepted draft is not the target's argmax."""
    import dataclasses

    ids = engine.tokenize(load_workload("edit")[0].text)
    recs = run(engine, ids, drafter=NgramDrafter(), k=3, max_tokens=MAX)
    assert verify_oracle(engine, ids, recs) == []
    i = next(j for j, r in enumerate(recs) if r.accepted > 0)
    r = recs[i]
    wrong = (r.draft[0] + 1) % engine.n_vocab
    recs[i] = dataclasses.replace(r, draft=[wrong, *r.draft[1:]], tokens=[wrong, *r.tokens[1:]])
    bad = verify_oracle(engine, ids, recs)
    assert bad and bad[0]["step"] == r.step and bad[0]["position"] == 0


def test_ngram_drafter_proposes_the_most_recent_continuation():
    d = NgramDrafter(n_min=2, n_max=3)
    hist = [1, 2, 3, 4, 9, 1, 2, 3, 5, 7, 1, 2, 3]
    d.begin(hist[:4])
    # longest suffix n-gram [1, 2, 3] last occurred at index 5, followed by 5, 7, 1
    assert d.propose(hist, 3).tokens == [5, 7, 1]
    assert d.propose(hist + [8], 3).tokens == []  # [3, 8] and [2, 3, 8] never occurred
    assert NgramDrafter().propose([4, 4], 2).tokens == []
