"""labkit.decoding.drafters.mtp: MTP drafting through llama.cpp's MTP context, on synthetic-mtp.

Random weights make the MTP head's drafts almost always wrong, so besides the
lossless invariant (speculative greedy output == plain greedy output) an oracle
drafter forces accepted drafts through the loop while the MTP drafter keeps its
state, and that state is checked against one rebuilt from scratch.
"""

from __future__ import annotations

import numpy as np
import pytest

from labkit.analysis.lossless import divergence_report
from labkit.artifacts import synthetic
from labkit.decoding import drafters, loop
from labkit.decoding.drafters.base import Draft, Drafter
from labkit.decoding.drafters.mtp import MTPDrafter
from labkit.engines.llamacpp import LlamaCppEngine
from labkit.errors import LabkitError

MAX_TOKENS = 24


@pytest.fixture(scope="module")
def mtp_model(tmp_path_factory):
    path = tmp_path_factory.mktemp("mtp") / "synthetic-mtp.gguf"
    return path, synthetic.write("synthetic-mtp", path)


def engine(path, made=None, **kw):
    return LlamaCppEngine(path, n_ctx=256, n_threads=1, load_mtp=True, artifact=made, **kw)


@pytest.fixture(scope="module")
def prompt():
    return np.random.default_rng(0).integers(0, synthetic.config_for("synthetic-mtp")["n_vocab"], 16).tolist()


@pytest.fixture(scope="module")
def plain(mtp_model, prompt):
    with engine(mtp_model[0]) as e:
        return loop.tokens_of(loop.run(e, prompt, k=0, max_tokens=MAX_TOKENS))


def assert_well_formed(records, k):
    assert records[0].mode == "prefill"
    for r in records[1:]:
        assert r.mode == "spec" and r.k <= k
        assert 0 <= r.accepted <= r.drafted <= r.k and r.m == r.drafted + 1
        assert len(r.outcomes) == r.drafted and r.outcomes[: r.accepted] == [1] * r.accepted
        assert r.draft_ms > 0 and r.verify_ms > 0 and r.tokens
        assert r.from_draft == [True] * r.accepted + [False] * (len(r.tokens) - r.accepted)
    assert sum(len(r.tokens) for r in records) == MAX_TOKENS


@pytest.mark.parametrize("catchup", ["deferred", "eager"])
def test_greedy_mtp_is_lossless(mtp_model, prompt, plain, catchup):
    path, made = mtp_model
    with engine(path, made) as e:
        d = MTPDrafter(e, catchup=catchup)
        records = loop.run(e, prompt, drafter=d, k=2, max_tokens=MAX_TOKENS)
        spec = loop.tokens_of(records)
        report = divergence_report(e, prompt, plain, spec)
        assert report["lossless"], report
        assert_well_formed(records, 2)
        assert sum(r.drafted for r in records) > 0
        desc = d.describe()
        assert desc["drafter"] == "mtp" and desc["nextn_layers"] == 1 and desc["catchup"] == catchup
        assert desc["synthetic"] and "meaningless" in desc["note"]
        assert desc["stats"]["draft_rows"] == sum(r.drafted for r in records)
        d.close()


class Oracle(Drafter):
    """Runs the MTP drafter (so its state machine sees every step) but proposes the
    target's known greedy continuation, with every other second token spoiled, so
    the loop accepts k, then 1, then k drafts...; records what the MTP proposed."""

    def __init__(self, mtp, prompt, plain):
        self.mtp, self.n_prompt, self.plain = mtp, len(prompt), plain
        self.seen: list[tuple[list[int], list[int], np.ndarray]] = []
        self.calls = 0

    def begin(self, prompt, *, keep=0):
        self.mtp.begin(prompt, keep=keep)

    def propose(self, history, k, *, temperature=0.0, rng=None):
        d = self.mtp.propose(history, k)
        self.seen.append((list(history), d.tokens, self.mtp._mtp.logits().copy()))
        done = len(history) - self.n_prompt
        out = list(self.plain[done : done + k])
        self.calls += 1
        if self.calls % 2 == 0 and len(out) > 1:
            out[1] = (out[1] + 1) % len(self.mtp._mtp.logits())
        return Draft(out)


def from_scratch(path, history, k):
    """The MTP proposal for ``history`` with both caches built in one go."""
    with engine(path) as e:
        d = MTPDrafter(e)
        e.decode(list(history[:-1]), all_logits=False)
        d.begin(history[:-1])
        out = d.propose(history, k)
        row = d._mtp.logits().copy()
        d.close()
    return out.tokens, row


def test_mtp_state_follows_accepted_rows(mtp_model, prompt, plain):
    path, _ = mtp_model
    with engine(path) as e:
        oracle = Oracle(MTPDrafter(e), prompt, plain)
        records = loop.run(e, prompt, drafter=oracle, k=3, max_tokens=MAX_TOKENS)
        assert loop.tokens_of(records) == plain
        accepted = [r.accepted for r in records[1:]]
        assert 3 in accepted and 1 in accepted  # both full and partial acceptance happened
        oracle.mtp.close()
    for history, tokens, row in oracle.seen:
        ref_tokens, ref_row = from_scratch(path, history, len(tokens))
        # one catch-up batch vs many small ones: equal up to kernel rounding
        np.testing.assert_allclose(row, ref_row, atol=2e-3 * float(np.abs(ref_row).max()))
        assert tokens == ref_tokens


def test_sampled_drafts_carry_q(mtp_model, prompt):
    path, _ = mtp_model
    with engine(path) as e:
        d = MTPDrafter(e)
        qs = []
        orig = d.propose

        def spy(history, k, **kw):
            draft = orig(history, k, **kw)
            qs.append((draft.tokens, draft.q))
            return draft

        d.propose = spy
        a = loop.tokens_of(loop.run(e, prompt, drafter=d, k=2, max_tokens=MAX_TOKENS, temperature=0.8, seed=3))
        b = loop.tokens_of(loop.run(e, prompt, drafter=d, k=2, max_tokens=MAX_TOKENS, temperature=0.8, seed=3))
        assert a == b and len(a) == MAX_TOKENS
        for tokens, q in qs:
            assert q is not None and len(q) == len(tokens)
            for t, row in zip(tokens, q):
                assert abs(row.sum() - 1) < 1e-6 and row[t] > 0
        d.close()


def test_model_without_nextn_is_refused(tmp_path):
    path = tmp_path / "synthetic-dense.gguf"
    synthetic.write("synthetic-dense", path)
    with LlamaCppEngine(path, n_ctx=64, n_threads=1) as e:
        with pytest.raises(LabkitError, match="no MTP/nextn layers") as err:
            MTPDrafter(e)
        assert "ngram" in err.value.fix


def test_history_must_follow_the_target(mtp_model):
    with engine(mtp_model[0]) as e:
        d = MTPDrafter(e)
        e.decode([1, 2, 3], all_logits=False)
        d.begin([1, 2, 3])
        with pytest.raises(LabkitError, match="does not end one past"):
            d.propose([1, 2, 3], 2)
        assert len(d.propose([1, 2, 3, 4], 2).tokens) == 2
        d.close()


def test_registered(mtp_model):
    """The registry makes an MTPDrafter for "mtp" and marks it as needing the MTP context;
    recipes and --drafter choices read their names from the same registry."""
    spec = drafters.get("mtp")
    assert spec.mtp_context and not drafters.get("ngram").mtp_context
    assert "mtp" in drafters.names()
    with engine(mtp_model[0]) as e:
        d = drafters.make("mtp", None, e)
        assert isinstance(d, MTPDrafter)
        d.close()


def test_a_second_close_does_not_undo_a_newer_drafter(mtp_model, prompt):
    with engine(mtp_model[0]) as e:
        old = MTPDrafter(e)
        old.close()
        new = MTPDrafter(e)
        old.close()  # e.g. the garbage collector finalising the old one
        records = loop.run(e, prompt, drafter=new, k=2, max_tokens=8)
        assert sum(len(r.tokens) for r in records) == 8
        new.close()


@pytest.mark.slow  # papermill
def test_the_mtp_recipe_reproduces_end_to_end(store):
    """experiments/mtp-synthetic.yaml through every notebook: the ones that need text (04's
    tool suite, 07's re-bench) finish SKIPPED with the reason logged, the rest measure."""
    from labkit.provenance import reproduce as rp
    from labkit.provenance import tracking

    params = {"runs": 1, "max_tokens": 8, "verify_rounds": 4, "crosscheck_rounds": 2}
    s = rp.reproduce(recipe="mtp-synthetic", out_dir=str(store / "mtp-out"), params=params)
    assert s["ok"], [(r["notebook"], r["error"]) for r in s["results"]]
    c = tracking.client()
    tags = {r["notebook"]: c.get_run(r["run_id"]).data.tags for r in s["results"]}
    assert "no tokenizer" in tags["07_concurrency"]["lab.skipped"] and "no tokenizer" in tags["04_tool_suite_qc"]["lab.skipped"]
    assert "lab.skipped" not in tags["02_k_sweep"] and tags["02_k_sweep"]["recipe"] == "mtp-synthetic"
    # the worksheet says why production concurrency has no data, and a keep cannot count it as re-benched
    from labkit.config.recipe import effective_recipe
    from labkit.report import worksheet

    rows = {r["item"]: r for r in worksheet.accounting(c, effective_recipe({"recipe": "mtp-synthetic", **params}))}
    conc = rows["production concurrency (re-bench)"]["candidate"]
    assert conc.startswith("no data:") and "skipped the re-bench: the model has no tokenizer" in conc
