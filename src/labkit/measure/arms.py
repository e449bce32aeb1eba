"""Arms: the unit a long measurement journals as it goes and a resumed one skips.

An arm is one measured unit (a generation of the k sweep, a task of the tool suite with all its runs, a
power window). A measurement function that can be resumed takes two keyword arguments:

- ``on_arm(key, row, records)``: called as each arm finishes, with its summary row and
  its step records; it may return a dict of columns to add to the row (the session adds
  where and when the arm was measured). An ``on_arm`` with a ``plan(keys)`` method is
  told every key the call will measure, in order, before the first one (for progress).
- ``skip``: key -> row of arms already measured (by an interrupted run); such an arm is
  not measured again, its row (and its records, under ``_records``) are used as they are.

Keys are built from the recipe alone (prompt, temperature, round, drafter, k, ...), never
from timing, so a resumed run finds them; the order arms are measured in stays the one
``order.arm_order`` gives. Nothing here knows about MLflow: the session journals.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable

from labkit.decoding.records import StepRecord

SEP = "~"  # between key parts: safe in file and artifact names, absent from prompt ids


def key(*parts) -> str:
    """A deterministic arm key from its parts (``edit-001~T0~r1~ngram~k2``)."""
    out = []
    for p in parts:
        s = f"{p:g}" if isinstance(p, float) else str(p)
        out.append(re.sub(r"[^A-Za-z0-9._-]", "_", s))
    return SEP.join(out)


def plan(on_arm: Callable | None, keys: Iterable[str]) -> None:
    """Tell ``on_arm`` (when it listens) every key this call will go through, in order."""
    hook = getattr(on_arm, "plan", None)
    if hook is not None:
        hook(list(keys))


def finished(on_arm: Callable | None, arm_key: str, row: dict, records) -> dict:
    """Report a finished arm; the columns ``on_arm`` returns are added to ``row``."""
    if on_arm is not None:
        row.update(on_arm(arm_key, row, records) or {})
    return row


def restored(skip: dict | None, arm_key: str) -> tuple[dict, object] | None:
    """(row, records) of an arm measured earlier, or None when it must be measured now.
    The row is a copy without ``_records``; records come back as ``StepRecord`` lists
    (or a dict of them, for arms that kept records per task)."""
    if not skip or arm_key not in skip:
        return None
    row = dict(skip[arm_key])
    return row, records_from(row.pop("_records", None))


def records_from(obj):
    """StepRecords from the compact form the journal keeps (``{"fields", "rows"}``), or
    a dict of such forms; lists of StepRecords pass through."""
    if obj is None:
        return None
    if isinstance(obj, dict) and "fields" in obj and "rows" in obj:
        return [StepRecord(**dict(zip(obj["fields"], r))) for r in obj["rows"]]
    if isinstance(obj, dict):
        return {k: records_from(v) for k, v in obj.items()}
    return list(obj)
