"""Tiny parameters the tests give real reproductions, in one place."""

from __future__ import annotations

import json
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]

# 01_cost_fit in seconds: three m, few rounds, a shallow KV cache. crosscheck_rounds 2: the fewest
# that give the llama-bench ratio an interval (8 s less per 01 on 2 cores); more rounds are the
# same loop, and `make reproduce` runs the recipe's 5. No op profile (3 s per 01 on 2 cores):
# test_op_profile checks it, and test_notebooks_e2e runs 01 with it
FAST_01 = {"verify_rounds": 3, "verify_m": [1, 2, 3], "kv_depth": 32, "crosscheck_rounds": 2, "op_profile_rounds": 0}


def as_cli(params: dict) -> list[str]:
    """``params`` as ``labkit reproduce`` arguments: ``-p name=<JSON>`` each."""
    return [a for k, v in params.items() for a in ("-p", f"{k}={json.dumps(v)}")]


def recipe_file(path: Path, **fields) -> str:
    """A recipe file at ``path``: the default's fields with ``fields`` on top, named after the file."""
    data = yaml.safe_load((ROOT / "experiments" / "default.yaml").read_text())
    data.update(name=path.stem, **fields)
    path.write_text(yaml.safe_dump(data))
    return str(path)
