"""Speculative sampling preserves the target distribution (statistical tests)."""

from __future__ import annotations

import numpy as np
import pytest
from scipy import stats

from labkit.decoding.drafters.model import ModelDrafter
from labkit.decoding.drafters.ngram import NgramDrafter
from labkit.decoding.loop import run
from labkit.decoding.sampling import accept_or_resample, sample, softmax

PROMPT = "My favourite fruit is the"


def _row(engine, text):
    engine.rollback(0)
    engine.decode(engine.tokenize(text), all_logits=False)
    row = np.array(engine.logits(-1))
    engine.rollback(0)
    return row


def _chi2_against(p, draws, min_expected=5):
    """Goodness of fit of ``draws`` to ``p`` over the categories with enough mass."""
    n = len(draws)
    top = np.argsort(p)[::-1]
    keep = [t for t in top if p[t] * n >= min_expected]
    counts = np.bincount(draws, minlength=len(p))
    obs = [counts[t] for t in keep] + [n - sum(counts[t] for t in keep)]
    exp = [p[t] * n for t in keep] + [n * (1 - sum(p[t] for t in keep))]
    return stats.chisquare(obs, exp).pvalue, len(keep)


@pytest.mark.parametrize("deterministic", [True, False])
def test_accept_or_resample_reproduces_target(engine, draft_engine, deterministic):
    """With real target and draft rows: emitted tokens ~ p, whatever the draft."""
    p = softmax(_row(engine, PROMPT), 1.0)
    q = softmax(_row(draft_engine, PROMPT + " big"), 1.0)  # a deliberately different draft distribution
    # The decision holds for any pair of distributions, so it is tested on the rows' head: the
    # 4096 tokens with the most mass in p or in q, and one bucket for the rest of each row
    # (~1% of the mass), which keeps 20000 draws and the power check below at ~1/40 of the
    # full-vocabulary cost.
    head = np.union1d(np.argsort(p)[-4096:], np.argsort(q)[-4096:])
    p, q = (np.append(r[head], max(0.0, 1.0 - r[head].sum())) for r in (p, q))
    rng = np.random.default_rng(1)
    draws = []
    for _ in range(20000):
        if deterministic:
            x = int(np.argmax(q))  # e.g. an n-gram lookup: always the same token
            _, t = accept_or_resample(p, x, None, rng)
        else:
            x = sample(q, rng)
            _, t = accept_or_resample(p, x, q, rng)
        draws.append(t)
    pval, cats = _chi2_against(p, np.array(draws))
    assert cats >= 3
    assert pval > 1e-3
    # and the test has power: draws from q instead of p are rejected
    q_draws = np.array([sample(q, rng) for _ in range(20000)])
    assert _chi2_against(p, q_draws)[0] < 1e-6


@pytest.mark.slow  # 300 sampled decodes on the target and the draft model
def test_speculative_sampling_end_to_end(engine, draft_engine):
    """The token after the first speculative step has the same distribution as plain sampling."""
    ids = engine.tokenize(PROMPT)
    T = 1.0
    n = 150
    plain, spec = [], []
    drafter = ModelDrafter(draft_engine, target=engine)
    for s in range(n):
        plain.append(run(engine, ids, max_tokens=2, temperature=T, seed=s)[1].tokens[0])
        spec.append(run(engine, ids, drafter=drafter, k=2, max_tokens=2, temperature=T, seed=10_000 + s)[1].tokens[0])
    cats = sorted(set(plain) | set(spec), key=lambda t: -(plain.count(t) + spec.count(t)))
    big = [t for t in cats if plain.count(t) + spec.count(t) >= 10]
    table = [[plain.count(t) for t in big] + [n - sum(plain.count(t) for t in big)],
             [spec.count(t) for t in big] + [n - sum(spec.count(t) for t in big)]]
    table = [row for row in np.array(table).T.tolist() if sum(row) > 0]
    pval = stats.chi2_contingency(np.array(table).T).pvalue
    assert pval > 1e-3, table


def test_sampled_ngram_run_is_seeded(engine):
    ids = engine.tokenize("one two three one two three one two")
    a = run(engine, ids, drafter=NgramDrafter(), k=3, max_tokens=16, temperature=0.8, seed=5)
    b = run(engine, ids, drafter=NgramDrafter(), k=3, max_tokens=16, temperature=0.8, seed=5)
    assert [r.tokens for r in a] == [r.tokens for r in b]
