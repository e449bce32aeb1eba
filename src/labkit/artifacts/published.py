"""The seeds' published numbers (``data/published/seeds.yaml``) and header-only GGUFs of the
model layouts they assume, written once into the cache: the planner's outside check.

The layouts are ASSUMED (the sources do not name the models); the file says so beside them.
"""

from __future__ import annotations

import hashlib
import json
import os

import yaml

from labkit.artifacts import gguf_profile
from labkit.errors import LabkitError
from labkit.paths import cache_dir, data_dir

SEEDS = "seeds.yaml"


def load(name: str = SEEDS) -> dict:
    path = data_dir() / "published" / name
    if not path.is_file():
        raise LabkitError(f"published data not found: {path}", "restore data/published/ from the repository")
    return yaml.safe_load(path.read_text())


def model_profiles(data: dict) -> dict:
    """name -> ModelProfile of each assumed layout (a header-only GGUF, cached by its layout)."""
    out = {}
    for name, spec in data["assumed"]["models"].items():
        key = hashlib.sha256(json.dumps(spec, sort_keys=True).encode()).hexdigest()[:12]
        path = cache_dir() / "published" / f"{name}-{key}.gguf"
        if not path.exists():
            path.parent.mkdir(parents=True, exist_ok=True)
            tensors, md = gguf_profile.layout(**spec)
            tmp = path.with_name(f"{path.name}.{os.getpid()}.partial")  # two processes may write it at once
            gguf_profile.write_header_only(tmp, arch=spec["arch"], tensors=tensors, metadata=md)
            tmp.replace(path)
        out[name] = gguf_profile.read_profile(path)
    return out
