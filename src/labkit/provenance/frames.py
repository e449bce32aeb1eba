"""Frames as exact text: a DataFrame to and from JSON without loss, and its digest, so a
regenerated figure or table can be checked for being identical to what was logged.
"""

from __future__ import annotations

import hashlib
import json

import numpy as np
import pandas as pd


# -- canonical data ---------------------------------------------------------------------
def _py(v):
    if isinstance(v, (np.floating, float)):
        return float(v)
    if isinstance(v, (np.integer,)):
        return int(v)
    if isinstance(v, (np.bool_,)):
        return bool(v)
    if v is None or (isinstance(v, float) and np.isnan(v)):
        return None
    return v


def frame_to_json(df: pd.DataFrame) -> str:
    """Exact, canonical JSON of a DataFrame (floats round-trip through repr)."""
    data = [[_py(v) for v in row] for row in df.itertuples(index=False, name=None)]
    return json.dumps({"columns": [str(c) for c in df.columns], "data": data}, separators=(",", ":"))


def frame_from_json(text: str) -> pd.DataFrame:
    d = json.loads(text)
    return pd.DataFrame(d["data"], columns=d["columns"])


def digest(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()[:16]
