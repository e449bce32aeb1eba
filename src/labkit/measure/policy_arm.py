"""The draft length policy as an arm of a sweep (``k: auto`` in a recipe).

``policy_arms`` turns the recipe's policy (``priced`` for ``k: auto``) into one arm per
drafter, ``<drafter>+<policy>`` at ``policy_k_max``, priced with this host and build's own
verify(m): measured now (``policy_verify: measure``, m = 1..k_max+1) or refused
(``policy_verify: error``). ``measure.sweep.k_sweep(..., policies=...)`` runs them beside
plain (and the fixed k), so the policy's speedup gets the same paired CI and verdict as
every fixed k (``analysis.verdicts.policy_table``).
"""

from __future__ import annotations

from collections.abc import Callable

from labkit.config import runtime
from labkit.errors import LabkitError

Progress = Callable[[str], None] | None


def verify_model(recipe, engine, *, progress: Progress = None) -> tuple[object, str]:
    """This host and build's verify(m) model up to m = policy_k_max + 1, and where it came from."""
    from labkit.analysis import costmodel
    from labkit.measure import verify_cost

    need = recipe.policy_k_max + 1
    if recipe.policy_verify != "measure":
        raise LabkitError(f"recipe {recipe.name!r}: policy {recipe.policy!r} has no verify(m) model for this host "
                          f"and build (policy_verify: {recipe.policy_verify})",
                          f"set policy_verify: measure (m 1..{need}, {recipe.policy_verify_rounds} rounds first), "
                          "or drop auto from k")
    if progress:
        progress(f"k auto: measuring verify(m) for m = 1..{need} ({recipe.policy_verify_rounds} rounds)")
    res = verify_cost.bench_verify(engine, m_values=range(1, need + 1), rounds=recipe.policy_verify_rounds,
                                   kv_depth=recipe.kv_depth, seed=recipe.seed)
    return (costmodel.fit_verify_model(costmodel.verify_frame(res)),
            f"measured now: m 1..{need}, {recipe.policy_verify_rounds} rounds at KV depth {recipe.kv_depth}")


def policy_arms(recipe, engine, drafters: dict, *, progress: Progress = None, verify: tuple | None = None,
                policy: str | None = None) -> dict:
    """``{"<drafter>+<policy>": (drafter name, policy factory, k_max)}`` for every drafter of
    the sweep, and ``"_verify_source"``; ``{}`` when the recipe has no policy and ``policy``
    (the search's k auto candidate) names none. ``verify``: (a verify(m) model up to
    policy_k_max + 1, where it came from) the caller has measured already on this engine
    (02's own), instead of measuring it again."""
    name_of = policy or recipe.policy
    if name_of is None or not drafters:
        return {}
    vm, source = verify if verify is not None else verify_model(recipe, engine, progress=progress)
    out: dict = {"_verify_source": source}
    for name, d in drafters.items():
        out[f"{name}+{name_of}"] = (name, lambda d=d: runtime.make_policy(recipe, d, verify=vm, name=name_of),
                                    recipe.policy_k_max)
    return out


def concurrency_arm(recipe, engine, make_drafter, *, progress: Progress = None) -> tuple[tuple | None, str | None]:
    """The policy arm of the concurrency re-bench (``measure.concurrency.bench_concurrency``'s
    ``policy=``): (name, factory, k_max) and where its verify(m) came from; (None, None)
    when the recipe has no policy. A shared decode of c streams is priced with the same
    single-stream verify(m) over all its rows (07 fits the batch cost after the arms ran)."""
    if recipe.policy is None or make_drafter is None:
        return None, None
    vm, source = verify_model(recipe, engine, progress=progress)
    return (recipe.policy, lambda: runtime.make_policy(recipe, make_drafter(), verify=vm), recipe.policy_k_max), source


def arms_only(policies: dict) -> dict:
    """The arms of ``policy_arms`` (its bookkeeping keys left out)."""
    return {k: v for k, v in policies.items() if not k.startswith("_")}
