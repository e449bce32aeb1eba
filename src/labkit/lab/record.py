"""What a notebook logs of a result in one call, so the notebook stays a parameters cell, calls
and figures: the search's tables and tags (02)."""

from __future__ import annotations

from labkit.analysis import search


def record_search(lab, res: dict) -> None:
    """02's search: the ranking, the decisions (with the held-out check), the check's rows,
    the ladder's record (protocol-steps) and the tags advise, the worksheet and reproduce's
    summary read (``analysis.search.tags``)."""
    lab.table("search-ranking", res["ranked"], display=False)
    lab.table("search-decisions", search.decisions_table(res))
    lab.table("search-check-runs", res["check_rows"], display=False)
    lab.table("protocol-steps", res["steps"], display=False)
    lab.tags(search.tags(res, source=str(lab.id.child("search-decisions"))))
