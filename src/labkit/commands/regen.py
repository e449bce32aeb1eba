"""``labkit regen LAB:…``: regenerate a figure or table from its logged data alone and
report whether the regenerated data is identical; with --rerun, execute the notebook
again with the same parameters and compare the new figure with the old within noise."""

from __future__ import annotations

import argparse
from pathlib import Path

from labkit.commands import emit, progress
from labkit.paths import project_root
from labkit.report.regen import regen


def setup_arg_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="labkit regen", description=__doc__)
    p.add_argument("id", help="LAB:<run>/<figure-or-table name> or LAB:<run>/cN")
    p.add_argument("--rerun", action="store_true", help="re-execute the notebook and compare within noise")
    p.add_argument("--out", default=None, help="where regenerated files go (default: runs/regen)")
    return p


def main(argv=None) -> int:
    args = setup_arg_parser().parse_args(argv)
    out = Path(args.out) if args.out else project_root() / "runs" / "regen"
    res = regen(args.id, out_dir=out, rerun=args.rerun, progress=progress)
    emit(res)
    ok = res["identical"] and (not args.rerun or res["rerun"]["within_noise"])
    return 0 if ok else 1
