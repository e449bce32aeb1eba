"""One interleaving policy for every measurement that compares arms.

Arms measured back to back drift with the box (thermal state, caches, other load), so
every comparison (the k sweep, spec vs plain, power runs, the concurrency re-bench) runs
its arms interleaved by the same policy and records which:

- ``random``: a fresh seeded permutation of the arms in every round (the default); the
  order is reproducible from the seed and the round.
- ``abba``: the arms in order, then reversed, alternating by round (two arms: A B, B A).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from labkit.errors import LabkitError

POLICIES = ("random", "abba")
DEFAULT_POLICY = "random"


def arm_order(arms: Sequence, round_index: int, *, policy: str = DEFAULT_POLICY, seed: int = 0) -> list:
    """The arms in the order round ``round_index`` measures them."""
    if policy == "random":
        rng = np.random.default_rng([seed, round_index])
        return [arms[i] for i in rng.permutation(len(arms))]
    if policy == "abba":
        return list(arms) if round_index % 2 == 0 else list(reversed(arms))
    raise LabkitError(f"unknown interleaving policy {policy!r}", f"use one of {', '.join(POLICIES)}")


def describe(policy: str, seed: int) -> str:
    """How a run's arms were ordered, for its provenance."""
    return f"random permutation per round (seed {seed})" if policy == "random" else "ABBA by round"
