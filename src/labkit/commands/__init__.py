"""One module per ``labkit`` command, and the one output convention they share.

A terminal is read by a person: by default a command prints a few lines, the verdict first,
each line short enough to read without wrapping (at most ``MAX_LINE`` characters), with the
``[LAB: …]`` IDs to dig further. ``--json`` prints the machine object instead, alone on
stdout, so that ``labkit … --json | jq`` works. Progress and warnings always go to stderr.
(The scripts under ``benchmarks/`` keep their own convention: JSON as the last line.)
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from collections.abc import Callable, Iterable

MAX_LINE = 300  # the longest line a command's human form prints (tests hold every command to it)
JSON_HELP = "print only the machine-readable result: one JSON object on stdout (progress stays on stderr)"


def add_json_flag(p: argparse.ArgumentParser) -> argparse.ArgumentParser:
    """``--json`` on a command (or subcommand) parser."""
    p.add_argument("--json", action="store_true", help=JSON_HELP)
    return p


def output(args, human: Iterable[str] | Callable[[], Iterable[str]], obj) -> None:
    """The command's answer: ``human`` (lines, or a function making them) by default,
    ``obj`` as one JSON document with ``--json``. Only one of the two is written."""
    if getattr(args, "json", False):
        emit(obj)
        return
    lines = human() if callable(human) else human
    sys.stdout.write("".join(f"{line}\n" for line in lines))
    sys.stdout.flush()


def emit(obj) -> None:
    """One JSON document on its own line of stdout (``output`` with ``--json``; scripts).
    A non-finite number (the open end of a one-pair interval) is written as null: ``jq`` and
    most JSON readers refuse Python's ``Infinity`` and ``NaN``."""
    sys.stdout.write(json.dumps(_finite(obj), default=_default, ensure_ascii=False, allow_nan=False) + "\n")
    sys.stdout.flush()


def _finite(o):
    if isinstance(o, float):
        return o if math.isfinite(o) else None
    if isinstance(o, dict):
        return {k: _finite(v) for k, v in o.items()}
    if isinstance(o, (list, tuple)):
        return [_finite(v) for v in o]
    return o


def cite(lab_id) -> str:
    """``[LAB:…]`` for a line a person reads, or "" when there is no ID."""
    return f"[{lab_id}]" if lab_id else ""


def _default(o):
    try:
        import numpy as np

        if isinstance(o, np.generic):
            return _finite(o.item())
        if isinstance(o, np.ndarray):
            return _finite(o.tolist())
    except ImportError:
        pass
    return str(o)


def progress(msg: str) -> None:
    """Progress for long work goes to stderr, so stdout stays the answer."""
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)
