"""MLflow tracking and ``[LAB: …]`` provenance IDs.

ID scheme (short enough to cite in prose, unique per run, resolvable, related by recipe):

    LAB:01-3fa2c1-k7q2m          a notebook run: notebook number, recipe hash (6), run token (5)
    LAB:01-3fa2c1-k7q2m/c5       cell 5 of that run (executed code cells, counted from 1)
    LAB:01-3fa2c1-k7q2m/cost-fit a named figure or table of that run

Two runs of the same notebook and recipe share the ``01-3fa2c1`` prefix; the run token
is drawn from the MLflow run id and checked unique. Every run is tagged ``lab.id``,
so an ID resolves with one tag search, on a local SQLite store or an ``mlflow server``.
"""

from __future__ import annotations

import re
import string
from dataclasses import dataclass
from pathlib import Path

from labkit.errors import LabkitError

ID_RE = re.compile(r"^\[?\s*(?:LAB:\s*)?(?P<run>\d{2}-[0-9a-f]{6}-[a-z0-9]{5})(?:/(?P<part>[A-Za-z0-9_.\-]+))?\s*\]?$")


_ALPHABET = string.ascii_lowercase + string.digits


def notebook_number(notebook: str) -> str:
    m = re.match(r"(\d{2})", Path(notebook).name)
    return m.group(1) if m else "00"


def make_run_token(run_id: str) -> str:
    n = int(run_id[:16], 16) if re.fullmatch(r"[0-9a-f]+", run_id[:16]) else hash(run_id)
    return "".join(_ALPHABET[(n >> (6 * i)) % len(_ALPHABET)] for i in range(5))


@dataclass(frozen=True)
class LabId:
    run: str  # "01-3fa2c1-k7q2m"
    part: str | None = None  # "c5" or a figure/table name

    def __str__(self) -> str:
        return f"LAB:{self.run}" + (f"/{self.part}" if self.part else "")

    @property
    def cite(self) -> str:
        return f"[{self}]"

    def child(self, part: str) -> LabId:
        return LabId(self.run, part)


def parse_id(text: str) -> LabId:
    m = ID_RE.match(text.strip())
    if not m:
        raise LabkitError(
            f"{text!r} is not a labkit provenance ID",
            "IDs look like LAB:01-3fa2c1-k7q2m, LAB:01-3fa2c1-k7q2m/c5 or LAB:01-3fa2c1-k7q2m/cost-fit",
        )
    return LabId(m.group("run"), m.group("part"))
