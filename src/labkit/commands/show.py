"""``labkit show LAB:…``: what a provenance ID points at (run, cell or artifact,
parameters, provenance), as JSON."""

from __future__ import annotations

import argparse

from labkit.commands import emit
from labkit.provenance.show import show


def setup_arg_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="labkit show", description=__doc__)
    p.add_argument("id", help="e.g. LAB:01-3fa2c1-k7q2m/cost-fit (brackets optional)")
    return p


def main(argv=None) -> int:
    args = setup_arg_parser().parse_args(argv)
    emit(show(args.id))
    return 0
