"""Figures: registered seaborn plot functions, stamped with their ``[LAB: …]`` ID.

A figure is always drawn by a function registered here from a DataFrame plus JSON-able
keyword arguments. That is what makes ``labkit regen`` possible: the logged data and
arguments are enough to draw it again, and the function also returns the data it drew,
whose hash shows whether the regeneration is identical.
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
