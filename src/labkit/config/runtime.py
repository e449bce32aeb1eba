"""Turn a recipe into live objects: the target engine (with MTP heads when a drafter
needs them), drafters, the gate."""

from __future__ import annotations

from labkit.artifacts.loader import open_engine, resolve_model
from labkit.config.recipe import Recipe
from labkit.decoding import drafters
from labkit.decoding import policy as policies
from labkit.decoding.drafters import Drafter
from labkit.decoding.gate import AcceptanceGate
from labkit.errors import LabkitError

__all__ = ["make_drafter", "make_gate", "make_policy", "open_engine", "open_target", "resolve_model"]


def open_target(recipe: Recipe, *, drafter_names=None, **kw):
    """The target engine, opened with the MTP context when any of the recipe's drafters
    (or ``drafter_names``) needs it, so every notebook and command can run ``mtp``
    (``kw``: the multi-slot settings of ``open_engine``)."""
    names = recipe.drafters if drafter_names is None else drafter_names
    return open_engine(recipe, load_mtp=drafters.needs_mtp_context(names), **kw)


def make_drafter(name: str, recipe: Recipe, target) -> Drafter:
    """A drafter for ``target`` from the registry; model drafters load their own engine."""
    return drafters.make(name, recipe, target)


def make_gate(recipe: Recipe) -> AcceptanceGate | None:
    """The recipe's gate (its effective threshold, resolved at the boundary); 0 disables it."""
    g = AcceptanceGate(threshold=recipe.gate, window=recipe.gate_window, probe_every=recipe.gate_probe_every)
    return g if g.threshold > 0 else None


def make_policy(recipe: Recipe, drafter: Drafter, *, verify, batch_verify=None, profile=None, name: str | None = None):
    """The recipe's draft length policy (``policy``, or ``priced`` for ``k: auto``) for
    ``drafter``, priced with ``verify``: this host and build's verify(m) model
    (``costmodel.fit_verify_model``); ``batch_verify``: the shared-decode fit
    (``batchcost.fit``) for c > 1 streams; ``profile``: a sweep's per-position acceptance."""
    name = name or recipe.policy or "priced"
    if verify is None:
        how = ("measure it first: costmodel.fit_verify_model(costmodel.verify_frame(verify_cost.bench_verify("
               f"engine, m_values=range(1, {recipe.policy_k_max + 2})))), which `labkit bench spec --k auto` does "
               "with policy_verify: measure")
        raise LabkitError(f"policy {name!r} (k: auto) has no verify(m) model for this host and build "
                          f"(recipe {recipe.name!r}, policy_verify: {recipe.policy_verify})", how)
    return policies.make(name, k_max=recipe.policy_k_max, drafter=drafter, verify=verify,
                         batch_verify=batch_verify, profile=profile)
