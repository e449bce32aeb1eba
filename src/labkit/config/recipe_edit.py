"""Write a few top-level scalar fields into a recipe file, changing nothing else.

``labkit advise --write`` puts the protocol's winner into ``experiments/<name>.yaml``. A
YAML round trip would drop the comments and reflow the file, and a recipe's comments are
part of the record, so this edits lines: an existing top-level ``key: value`` line gets
its value (and trailing comment) replaced in place, a missing key is appended at the end.
Every other byte of the file stays as it was. A key whose value spans several lines (a
block list or mapping) is refused rather than guessed at.
"""

from __future__ import annotations

import json
import re

from labkit.errors import LabkitError


def _scalar(v) -> str:
    if v is None:
        return "null"
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, (int, float)):
        return json.dumps(v)
    if isinstance(v, dict):  # a flow mapping: JSON is YAML
        return json.dumps(v, ensure_ascii=False)
    return json.dumps(str(v)) if re.search(r"[:#\[\]{},&*!|>'\"%@`]|^\s|\s$", str(v)) else str(v)


def set_fields(text: str, fields: dict, *, comment: str | None = None, where: str = "the recipe") -> str:
    """``text`` with each top-level key in ``fields`` set to its value; ``comment`` goes
    beside each written line (``key: value  # comment``)."""
    lines = text.splitlines(keepends=True)
    tail = f"  # {comment}" if comment else ""
    for key, value in fields.items():
        pat = re.compile(rf"^{re.escape(key)}\s*:(.*?)(\r?\n)?$")
        hits = [i for i, line in enumerate(lines) if pat.match(line)]
        new = f"{key}: {_scalar(value)}{tail}"
        if len(hits) > 1:
            raise LabkitError(f"{where} sets {key!r} {len(hits)} times", f"keep one {key}: line, then retry")
        if hits:
            i = hits[0]
            m = pat.match(lines[i])
            rest = m.group(1).split("#", 1)[0].strip()
            nxt = lines[i + 1] if i + 1 < len(lines) else ""
            if not rest and nxt[:1] in (" ", "\t", "-"):
                raise LabkitError(f"{where}: {key} is written over several lines",
                                  f"write it on one line ({key}: value), then retry")
            lines[i] = new + (m.group(2) or "")
        else:
            if lines and not lines[-1].endswith("\n"):
                lines[-1] += "\n"
            lines.append(new + "\n")
    return "".join(lines)
