"""Engines are looked up by name; each is imported only when asked for.

A plain dict of ``name -> "module:Class"`` (papermill's registry style): importing
labkit never imports llama-cpp-python or mlx.
"""

from __future__ import annotations

import importlib

from labkit.engines.base import Engine, EngineError
from labkit.errors import LabkitError

ENGINES: dict[str, str] = {
    "llama.cpp": "labkit.engines.llamacpp:LlamaCppEngine",
    "mlx": "labkit.engines.mlx:MlxEngine",
}
EXTRAS = {"llama.cpp": "llama", "mlx": "mlx"}


def register(name: str, target: str) -> None:
    ENGINES[name] = target


def get(name: str) -> type[Engine]:
    if name not in ENGINES:
        raise LabkitError(f"unknown engine {name!r}", f"use one of {', '.join(ENGINES)}")
    module, cls = ENGINES[name].split(":")
    return getattr(importlib.import_module(module), cls)


__all__ = ["ENGINES", "Engine", "EngineError", "get", "register"]
