"""Turn a recipe into live objects: the target engine, drafters, the gate."""

from __future__ import annotations

from . import engines, models
from .drafters import DRAFTERS, Drafter, ModelDrafter, NgramDrafter
from .errors import LabkitError
from .loop import AcceptanceGate
from .recipe import Recipe


def resolve_model(recipe: Recipe, *, draft: bool = False):
    """The model artifact (llama.cpp) or directory (MLX) a recipe names."""
    name = recipe.draft_model if draft else recipe.model
    sha = recipe.draft_model_sha256 if draft else recipe.model_sha256
    if recipe.engine == "mlx":
        from .engines.mlx import resolve_mlx_model

        return resolve_mlx_model(name, expected_sha256=sha)
    return models.get(name, expected_sha256=sha)


def open_engine(recipe: Recipe, *, draft: bool = False, load_mtp: bool = False):
    """Load the recipe's target (or draft) model on the recipe's engine."""
    art = resolve_model(recipe, draft=draft)
    cls = engines.get(recipe.engine)
    kw = {"n_ctx": recipe.n_ctx, "n_threads": recipe.threads, "artifact": art.describe()}
    if recipe.engine == "llama.cpp":
        kw.update(n_gpu_layers=recipe.n_gpu_layers, load_mtp=load_mtp)
    return cls(art.path, **kw)


def make_drafter(name: str, recipe: Recipe, target) -> Drafter:
    """A drafter for ``target``; model drafters load their own engine."""
    if name == "ngram":
        return NgramDrafter(n_min=recipe.ngram_min, n_max=recipe.ngram_max)
    if name == "model":
        if not recipe.draft_model:
            raise LabkitError("drafter 'model' needs a draft model", "set draft_model in the recipe or pass --draft-model")
        return ModelDrafter(open_engine(recipe, draft=True), target=target)
    if name == "mtp":
        from . import mtp  # noqa: F401 - registers the drafter

        return DRAFTERS["mtp"](target)
    raise LabkitError(f"unknown drafter {name!r}", f"use one of {sorted(DRAFTERS)}")


def make_gate(recipe: Recipe, threshold: float | None = None) -> AcceptanceGate | None:
    """The recipe's gate: ``threshold`` > $AS_SPEC_MIN_ACCEPT > recipe; 0 disables it."""
    g = AcceptanceGate.from_env(
        threshold,
        default=recipe.gate,
        window=recipe.gate_window,
        probe_every=recipe.gate_probe_every,
    )
    return g if g.threshold > 0 else None
