"""``[LAB: …]`` provenance IDs: ``LAB:<nb>-<recipe hash>-<token>[/<part>]`` for runs, cells,
figures and tables, and the citable documents (``LAB:RESULTS-MATRIX §E``, ``LAB:WORKSHEET §…``).
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


# Documents a chapter cites by section ("[LAB: RESULTS-MATRIX §E]"): they are not runs but
# views built from the newest logged runs, so they resolve to the runs and tables behind them.
DOCUMENTS = {
    "RESULTS-MATRIX": {"A": "prefill: prefill tok/s and TTFT, apart from decode",
                       "B": "concurrency: aggregate and per-stream tok/s at each concurrency",
                       "E": "the n_max matrix: tok/s (x) @ first-token acceptance per n_max"},
    "WORKSHEET": {"field": "the short field worksheet (7 items)",
                  "accounting": "the accounting table: Baseline / Candidate / Notes"},
}
DOC_RE = re.compile(r"^\[?\s*(?:LAB:\s*)?(?P<doc>[A-Z][A-Z0-9]*(?:-[A-Z0-9]+)*)\s*(?:§\s*(?P<section>[A-Za-z0-9_\-]+))?\s*\]?$")


@dataclass(frozen=True)
class SectionId:
    doc: str  # "RESULTS-MATRIX"
    section: str | None = None  # "E"; None: the whole document

    def __str__(self) -> str:
        return f"LAB:{self.doc}" + (f" §{self.section}" if self.section else "")

    @property
    def cite(self) -> str:
        return f"[{self}]"

    @property
    def title(self) -> str:
        return DOCUMENTS[self.doc][self.section] if self.section else self.doc


def sections_text(doc: str) -> str:
    return ", ".join(f"§{s} ({what.split(':')[0]})" for s, what in DOCUMENTS[doc].items())


def parse_ref(text: str) -> LabId | SectionId:
    """A run/cell/artifact ID (``parse_id``) or a document section such as ``RESULTS-MATRIX §E``.

    A document or section that does not exist is an error listing what does."""
    m = DOC_RE.match(text.strip())
    if m is None or ID_RE.match(text.strip()):
        return parse_id(text)
    doc, section = m.group("doc"), m.group("section")
    if doc not in DOCUMENTS:
        raise LabkitError(f"{text!r} is not a labkit provenance ID: there is no document {doc!r}",
                          "IDs look like LAB:01-3fa2c1-k7q2m/cost-fit or a document section: "
                          + "; ".join(f"LAB:{d} {sections_text(d)}" for d in DOCUMENTS))
    if section is not None:
        known = {s.lower(): s for s in DOCUMENTS[doc]}
        if section.lower() not in known:
            raise LabkitError(f"{doc} has no section §{section}", f"its sections are {sections_text(doc)}")
        section = known[section.lower()]
    return SectionId(doc, section)
