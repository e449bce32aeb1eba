"""``labkit show LAB:…``: what a provenance ID points at (run, cell or artifact,
parameters, provenance), as JSON. A document section ("LAB:RESULTS-MATRIX §E",
"LAB:WORKSHEET §field") resolves to the runs and tables that back it."""

from __future__ import annotations

import argparse

from labkit.commands import emit
from labkit.provenance import ids
from labkit.provenance.show import show


def setup_arg_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="labkit show", description=__doc__)
    p.add_argument("id", help='e.g. LAB:01-3fa2c1-k7q2m/cost-fit (brackets optional) or "LAB:RESULTS-MATRIX §E"')
    p.add_argument("--recipe", default=None, help="for a worksheet section: the recipe (default: default)")
    return p


def main(argv=None) -> int:
    args = setup_arg_parser().parse_args(argv)
    ref = ids.parse_ref(args.id)
    if isinstance(ref, ids.SectionId):
        from labkit.config.recipe import load, resolve
        from labkit.provenance import tracking
        from labkit.report import sections

        emit(sections.show(tracking.client(), ref, recipe=resolve(load(args.recipe))))
        return 0
    emit(show(args.id))
    return 0
