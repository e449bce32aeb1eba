"""The drafter registry: ``name -> factory(recipe, target) -> Drafter``.

Registering a factory makes the drafter usable everywhere at once: recipe validation,
every command's ``--drafter`` choices and the notebooks read the names from here. A
factory receives the recipe (any object with its fields) and the target engine; model
drafters open their own engine. ``mtp_context`` marks drafters that need the target
opened with its MTP heads loaded.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from labkit.decoding.drafters.base import Draft, Drafter
from labkit.errors import LabkitError

Factory = Callable[[object, object], Drafter]


@dataclass(frozen=True)
class DrafterSpec:
    name: str
    factory: Factory
    mtp_context: bool = False
    help: str = ""


DRAFTERS: dict[str, DrafterSpec] = {}


def register(name: str, factory: Factory, *, mtp_context: bool = False, help: str = "") -> None:
    DRAFTERS[name] = DrafterSpec(name, factory, mtp_context, help)


def names() -> list[str]:
    return sorted(DRAFTERS)


def get(name: str) -> DrafterSpec:
    if name not in DRAFTERS:
        raise LabkitError(f"unknown drafter {name!r}", f"use one of {names()}")
    return DRAFTERS[name]


def make(name: str, recipe, target) -> Drafter:
    """A drafter for ``target`` from the recipe's settings."""
    return get(name).factory(recipe, target)


def needs_mtp_context(drafter_names) -> bool:
    return any(get(n).mtp_context for n in drafter_names)


def _ngram(recipe, target) -> Drafter:
    from labkit.decoding.drafters.ngram import NgramDrafter

    return NgramDrafter(n_min=recipe.ngram_min, n_max=recipe.ngram_max)


def _model(recipe, target) -> Drafter:
    from labkit.artifacts.loader import open_engine
    from labkit.decoding.drafters.model import ModelDrafter

    if not recipe.draft_model:
        raise LabkitError("drafter 'model' needs a draft model", "set draft_model in the recipe or pass --draft-model")
    return ModelDrafter(open_engine(recipe, draft=True), target=target)


def _mtp(recipe, target) -> Drafter:
    from labkit.decoding.drafters.mtp import MTPDrafter

    return MTPDrafter(target)


register("ngram", _ngram, help="prompt lookup: the longest n-gram of the history that recurs")
register("model", _model, help="a smaller draft model (recipe draft_model)")
register("mtp", _mtp, mtp_context=True, help="the target's own multi-token-prediction (nextn) heads")

__all__ = ["DRAFTERS", "Draft", "Drafter", "DrafterSpec", "get", "make", "names", "needs_mtp_context", "register"]
