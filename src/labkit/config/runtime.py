"""Turn a recipe into live objects: the target engine (with MTP heads when a drafter
needs them), drafters, the gate."""

from __future__ import annotations

from labkit.artifacts.loader import open_engine, resolve_model
from labkit.config.recipe import Recipe
from labkit.decoding import drafters
from labkit.decoding.drafters import Drafter
from labkit.decoding.gate import AcceptanceGate

__all__ = ["make_drafter", "make_gate", "open_engine", "open_target", "resolve_model"]


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
