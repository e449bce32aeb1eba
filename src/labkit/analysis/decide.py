"""Comparisons that decide: a paired ratio with its confidence interval and one of three verdicts.

Every verdict in labkit (a k against plain, the protocol's steps, the best k, speculation at
a concurrency, a drift between two runs, the cost model against measurement) goes through
``estimate``. The effect is the ratio of two paired arms (spec/plain on the same prompt and
round), taken on the log scale: a ratio of 1.10 and one of 1/1.10 are the same distance from
"no effect", and the geometric mean is the speedup a user sees over many prompts.

The interval respects the design. Prompts are the unit the verdict generalises to; rounds
are repeats within a prompt (the same prompt run again, interleaved with the other arms).
The model is the random-intercept one, log ratio = mu + prompt effect + round noise, and
the interval for mu is the classic one for a nested design: average each prompt's rounds
first, then a Student t interval over the n prompt means with n - 1 degrees of freedom
(for a balanced design this is exactly the REML mixed-model interval; an unbalanced one,
from sequential stopping or a resumed run, gives each prompt equal weight, which is the
claim we make: "over prompts like these"). Treating 3 rounds of one prompt as 3 prompts
would give intervals far too narrow for a claim about a workload. We chose this over a
bootstrap because the design has few clusters (2 prompts per workload in the default
recipe): a percentile bootstrap over 2-10 clusters under-covers badly (over 2 prompts its
95% interval covers about 60% of the time), and resampling rounds inside prompts as well
double-counts the round noise; the t interval is exact under normal prompt effects and
honest about how little 2 prompts say. With a single prompt the rounds are the only
replication, and the interval is over them (a claim about that prompt only).

Three verdicts, against a margin (the region of practical equivalence, default ±2%):
**wins** when the whole interval lies above 1 + margin, **loses** when it lies below
1 - margin, and **no measurable difference** otherwise. The last is a result, not a
failure: the decision it implies is the simpler option (speculation off).

Two corrections keep the error rate at its nominal level when more than one look or more
than one candidate is involved (both Bonferroni: simple, valid under any dependence, and
easy to state in a cell):
- ``adjust``: the best of S candidates picked from the same data (best k, the protocol's
  winner, 07's best arm) is judged at confidence 1 - alpha/S;
- ``looks``: sequential measurement that looks after every round and may stop early is a
  group-sequential design with a Bonferroni spending of alpha over its planned looks
  (at most ``max_rounds - min_rounds + 1``), so stopping when the interval is decided keeps
  the overall error rate at alpha. The reported interval is the one the verdict used.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

import numpy as np
import pandas as pd
from scipy import stats

from labkit.errors import LabkitError

VERDICTS = ("wins", "loses", "no measurable difference")
WINS, LOSES, NO_DIFF = VERDICTS
DEFAULT_MARGIN = 0.02
DEFAULT_CONFIDENCE = 0.95
AA = "aa"  # the drafter name of the A/A control arm: a second plain arm, interleaved like the others
BASE = "none"  # the drafter name of the plain baseline (k = 0)


def check_margin(margin: float, *, field: str = "decision_margin") -> float:
    if not (isinstance(margin, (int, float)) and 0 < margin < 0.5):
        raise LabkitError(f"{field} = {margin!r} is not a margin: it must lie in (0, 0.5), e.g. 0.02 for ±2%",
                          f"set {field} to a fraction such as 0.02 (the band 0.98–1.02 counts as no difference)")
    return float(margin)


def check_confidence(confidence: float, *, field: str = "decision_confidence") -> float:
    if not (isinstance(confidence, (int, float)) and 0.5 < confidence < 0.999):
        raise LabkitError(f"{field} = {confidence!r} is outside (0.5, 0.999)",
                          f"set {field} to a level such as 0.95")
    return float(confidence)


@dataclass(frozen=True, kw_only=True)
class Estimate:
    """A paired ratio (geometric mean over prompts), its interval and its verdict."""

    ratio: float | None
    lo: float | None
    hi: float | None
    verdict: str
    confidence: float  # the nominal (family-wise) level, e.g. 0.95
    level: float  # the level the interval was computed at, after the adjust/looks corrections
    margin: float
    n_prompts: int
    n_pairs: int
    adjust: int = 1
    looks: int = 1

    @property
    def decided(self) -> bool:
        return self.verdict != NO_DIFF and self.ratio is not None

    def ci_text(self) -> str:
        if self.ratio is None:
            return "no pairs"
        if self.hi is None or not np.isfinite(self.hi):
            return f"{self.ratio:.2f}× (one pair: no CI; measure at least 2 rounds)"
        return f"{self.ratio:.2f}× ({self.confidence:.0%} CI {self.lo:.2f}–{self.hi:.2f})"

    def line(self, name: str, *, acceptance: float | None = None) -> str:
        """``'ngram n_max=1: 0.96× (95% CI 0.93–0.99), loses; acceptance 89%'``."""
        acc = f"; acceptance {acceptance:.0%}" if acceptance is not None and acceptance == acceptance else ""
        return f"{name}: {self.ci_text()}, {self.verdict}{acc}"

    def to_dict(self, prefix: str = "") -> dict:
        return {f"{prefix}{k}": v for k, v in asdict(self).items()}


def verdict_of(lo: float, hi: float, margin: float) -> str:
    if lo > 1 + margin:
        return WINS
    if hi < 1 - margin:
        return LOSES
    return NO_DIFF


def estimate(pairs: pd.DataFrame, *, margin: float = DEFAULT_MARGIN, confidence: float = DEFAULT_CONFIDENCE,
             adjust: int = 1, looks: int = 1, seed: int | None = None) -> Estimate:
    """The geometric-mean ratio of ``pairs`` (columns prompt, round, ratio) with its interval.

    ``adjust`` candidates and ``looks`` sequential looks share alpha (module doc); ``seed``
    is accepted for callers that pass one everywhere (the interval is not random)."""
    check_margin(margin)
    check_confidence(confidence)
    level = 1 - (1 - confidence) / max(1, adjust) / max(1, looks)
    base = {"confidence": confidence, "level": level, "margin": margin, "adjust": adjust, "looks": looks}
    ratio = pairs["ratio"].to_numpy(float)
    ok = np.isfinite(ratio) & (ratio > 0)
    if not ok.any():
        return Estimate(ratio=None, lo=None, hi=None, verdict=NO_DIFF, n_prompts=0, n_pairs=0, **base)
    logs = np.log(ratio[ok])
    _, which = np.unique(pairs["prompt"].to_numpy()[ok].astype(str), return_inverse=True)
    means = np.bincount(which, logs) / np.bincount(which)
    n = len(means)
    units = means if n > 1 else logs  # one prompt: its rounds are the only replication
    centre = float(units.mean())
    if len(units) < 2:  # one pair says nothing about its own noise
        return Estimate(ratio=float(np.exp(centre)), lo=0.0, hi=float("inf"), verdict=NO_DIFF,
                        n_prompts=n, n_pairs=len(logs), **base)
    se = float(units.std(ddof=1)) / np.sqrt(len(units))
    half = float(stats.t.ppf(1 - (1 - level) / 2, len(units) - 1)) * se
    lo, hi = float(np.exp(centre - half)), float(np.exp(centre + half))
    return Estimate(ratio=float(np.exp(centre)), lo=lo, hi=hi, verdict=verdict_of(lo, hi, margin),
                    n_prompts=n, n_pairs=len(logs), **base)


def paired(rows: pd.DataFrame, *, arm: dict, base: dict | None = None, value: str = "e2e_tok_s",
           temperature: float | None = 0.0) -> pd.DataFrame:
    """Sweep rows -> pairs (workload, prompt, round, ratio): each warm row of ``arm`` over the
    ``base`` row (default: plain, drafter "none", k 0) of the same prompt, temperature and run
    (the first such row when a run has several)."""
    base = base or {"drafter": BASE, "k": 0}
    # masks and codes on the columns the pairing reads, in numpy: a search takes thousands of
    # looks, and filtering and joining frames whose rows carry per-position lists was most of its time
    keep = np.ones(len(rows), bool)
    if "cold" in rows:
        keep &= ~rows["cold"].astype(bool).to_numpy()
    if temperature is not None and "temperature" in rows:
        keep &= (rows["temperature"] == temperature).to_numpy()

    def pick(spec):
        m = keep.copy()
        for c, v in spec.items():
            m &= (rows[c] == v).to_numpy()
        return np.flatnonzero(m)

    a, b = pick(arm), pick(base)
    keys = [c for c in ("prompt", "temperature", "run") if c in rows]
    both = np.concatenate([a, b])
    code = np.zeros(len(both), np.int64)
    for c in keys:  # one integer per (prompt, temperature, run), NaN a value like any other
        codes, uniq = pd.factorize(rows[c].to_numpy()[both], use_na_sentinel=False)
        code = code * max(1, len(uniq)) + codes
    ca, cb = code[: len(a)], code[len(a):]
    ub, first = np.unique(cb, return_index=True)  # a base key's first row, as drop_duplicates keeps
    pos = np.searchsorted(ub, ca)
    hit = (pos < len(ub)) & (ub[np.minimum(pos, len(ub) - 1)] == ca) if len(ub) else np.zeros(len(a), bool)
    ia, ib = a[hit], b[first[pos[hit]]]
    val = rows[value].to_numpy()
    out = pd.DataFrame({"workload": rows["workload"].to_numpy()[ia] if "workload" in rows else "all",
                        "prompt": rows["prompt"].to_numpy()[ia],
                        "round": rows["run"].to_numpy()[ia] if "run" in rows else 0,
                        "ratio": val[ia] / val[ib]})
    return out


def compare(rows: pd.DataFrame, *, arm: dict, base: dict | None = None, value: str = "e2e_tok_s",
            temperature: float | None = 0.0, by_workload: bool = False, **kw) -> Estimate | dict:
    """``estimate`` of ``paired``; with ``by_workload`` a dict workload -> Estimate plus "all"."""
    pairs = paired(rows, arm=arm, base=base, value=value, temperature=temperature)
    if not by_workload:
        return estimate(pairs, **kw)
    out = {w: estimate(g, **kw) for w, g in pairs.groupby("workload", sort=True)}
    out["all"] = estimate(pairs, **kw)
    return out


def aa_control(rows: pd.DataFrame, *, temperature: float | None = 0.0, value: str = "e2e_tok_s",
               **kw) -> Estimate | None:
    """Plain vs plain (the A/A arm over the baseline): None when the rows carry no A/A arm."""
    if "drafter" not in rows or not (rows["drafter"] == AA).any():
        return None
    return compare(rows, arm={"drafter": AA, "k": 0}, value=value, temperature=temperature, **kw)


AA_NOISE_MARGINS = 5  # an A/A interval wider than ±5 margins (±10% at the default) is box noise


def aa_problem(aa: Estimate | None) -> str | None:
    """Why the A/A control says this run's verdicts are unreliable; None when it does not.

    Two ways: plain vs plain reads "wins" or "loses" (the box moved between arms), or it
    reads "no measurable difference" only because its interval is too wide to say anything,
    wider than ±``AA_NOISE_MARGINS`` margins: a box that cannot tell plain from plain
    within ±10% cannot judge a ±2% question, whatever the spec arms' own intervals say."""
    if aa is None:
        return None
    if aa.verdict != NO_DIFF:
        return f"A/A control reads {aa.verdict} ({aa.ci_text()})"
    if aa.ratio is None or aa.hi is None or not np.isfinite(aa.hi) or not aa.lo:
        return f"A/A control has no interval ({aa.ci_text()})"
    bound = AA_NOISE_MARGINS * aa.margin
    if aa.hi > 1 + bound or aa.lo < 1 / (1 + bound):
        return (f"A/A control's interval {aa.lo:.2f}–{aa.hi:.2f} is wider than ±{bound:.0%} "
                f"({AA_NOISE_MARGINS} × the ±{aa.margin:.0%} margin)")
    return None


def aa_reliable(aa: Estimate | None) -> bool | None:
    """The A/A control must read "no measurable difference" with an interval inside
    ±``AA_NOISE_MARGINS`` margins (``aa_problem``); None when there was none."""
    return None if aa is None else aa_problem(aa) is None


def without_control(rows: pd.DataFrame) -> pd.DataFrame:
    """The rows less the A/A arm (tables of cells, figures and costs are of real arms only)."""
    return rows if "drafter" not in rows else rows[rows["drafter"] != AA]


def projected_halfwidth(pairs: pd.DataFrame, *, rounds: int, level: float) -> float | None:
    """The CI half-width (log scale) to expect with ``rounds`` rounds per prompt, from the
    pairs' own variance components: a prompt mean varies by sigma_b^2 + sigma_w^2 / r, so
    more rounds shrink only the round part. None when there is nothing to estimate it from."""
    ratio = pairs["ratio"].to_numpy(float)
    ok = np.isfinite(ratio) & (ratio > 0)
    logs = np.log(ratio[ok])
    _, which = np.unique(pairs["prompt"].to_numpy()[ok].astype(str), return_inverse=True)
    n, counts = int(which.max()) + 1 if len(which) else 0, np.bincount(which) if len(which) else np.array([])
    if n == 0 or len(logs) - n < 1:
        return None  # no prompt has two rounds: the round noise is unknown
    means = np.bincount(which, logs) / counts
    sw2 = float(((logs - means[which]) ** 2).sum() / (len(logs) - n))
    tail = 1 - (1 - level) / 2
    if n == 1:
        return float(stats.t.ppf(tail, rounds - 1) * np.sqrt(sw2 / rounds)) if rounds > 1 else None
    sb2 = max(0.0, float(means.var(ddof=1)) - sw2 / float(counts.mean()))
    return float(stats.t.ppf(tail, n - 1) * np.sqrt((sb2 + sw2 / rounds) / n))


def rounds_to_resolve(est: Estimate, n_rounds: int) -> int | None:
    """About how many more rounds would narrow the interval enough to clear the margin band,
    assuming its width shrinks as 1/sqrt(rounds); None when decided or nothing to go on."""
    if est.decided or est.ratio is None or not est.lo or not np.isfinite(est.hi):
        return None
    centre, half = np.log(est.ratio), (np.log(est.hi) - np.log(est.lo)) / 2
    gap = abs(centre) - np.log1p(est.margin)
    if gap <= 0 or half <= 0:
        return None  # the estimate sits inside the band: more rounds converge on "no difference"
    need = n_rounds * (half / gap) ** 2
    return max(1, int(np.ceil(need - n_rounds)))


def undecided_text(est: Estimate, n_rounds: int) -> str:
    more = rounds_to_resolve(est, n_rounds)
    band = f"±{est.margin:.0%}"
    if more is None:
        return f"no measurable difference at this budget ({band} band)"
    return f"no measurable difference at this budget (would need ~{more} more rounds to resolve {band})"
