"""One module per ``labkit`` command."""

from __future__ import annotations

import json
import sys
import time


def emit(obj) -> None:
    """Machine-readable result: one JSON document as the last line of stdout."""
    sys.stdout.write(json.dumps(obj, default=_default, ensure_ascii=False) + "\n")
    sys.stdout.flush()


def _default(o):
    try:
        import numpy as np

        if isinstance(o, np.generic):
            return o.item()
        if isinstance(o, np.ndarray):
            return o.tolist()
    except ImportError:
        pass
    return str(o)


def progress(msg: str) -> None:
    """Progress for long work goes to stderr, so stdout stays machine-readable."""
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)
