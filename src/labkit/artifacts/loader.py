"""Open a recipe's model artifact on the recipe's engine.

Takes any object with the recipe's fields (``engine``, ``model``, ``model_sha256``,
``draft_model``, ``n_ctx``, ``threads``, ``n_gpu_layers``, ``n_cpu_moe``): this layer sits
below the recipe class, so drafter factories can open a draft engine without reaching up.
"""

from __future__ import annotations

from labkit import engines
from labkit.artifacts import zoo


def resolve_model(recipe, *, draft: bool = False):
    """The model artifact (llama.cpp) or directory (MLX) a recipe names."""
    name = recipe.draft_model if draft else recipe.model
    sha = recipe.draft_model_sha256 if draft else recipe.model_sha256
    if recipe.engine == "mlx":
        from labkit.artifacts.mlx_convert import resolve_mlx_model

        return resolve_mlx_model(name, expected_sha256=sha)
    return zoo.get(name, expected_sha256=sha)


def open_engine(recipe, *, draft: bool = False, load_mtp: bool = False, n_seq_max: int = 1,
                n_ctx: int | None = None, kv_unified: bool = True, eval_callback=None):
    """Load the recipe's target (or draft) model on the recipe's engine.

    ``n_seq_max`` > 1 opens a llama.cpp context of that many sequences (the multi-slot
    loop) with room for ``n_ctx`` positions each (default: the recipe's n_ctx), in one
    unified KV buffer unless ``kv_unified`` is False (see ``engines.llamacpp``).
    ``eval_callback``: llama.cpp's per-node graph callback (``measure.op_profile``).
    """
    art = resolve_model(recipe, draft=draft)
    cls = engines.get(recipe.engine)
    if n_seq_max > 1 and recipe.engine != "llama.cpp":
        from labkit.errors import LabkitError

        raise LabkitError(f"engine {recipe.engine} has no multi-sequence support",
                          "run the concurrency re-bench with engine: llama.cpp")
    per_seq = n_ctx or recipe.n_ctx
    kw = {"n_ctx": per_seq * n_seq_max, "n_threads": recipe.threads, "artifact": art.describe()}
    if recipe.engine == "llama.cpp":
        kw.update(n_gpu_layers=recipe.n_gpu_layers, load_mtp=load_mtp,
                  n_cpu_moe=0 if draft else getattr(recipe, "n_cpu_moe", 0))
        if n_seq_max > 1:
            kw.update(n_seq_max=n_seq_max, kv_unified=kv_unified)
        if eval_callback is not None:
            kw["eval_callback"] = eval_callback
    elif eval_callback is not None:
        from labkit.errors import LabkitError

        raise LabkitError(f"engine {recipe.engine} has no per-node graph callback", "profile ops with engine: llama.cpp")
    return cls(art.path, **kw)
