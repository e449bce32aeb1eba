"""``labkit models``: prepare the model zoo and list it with sha256 and provenance."""

from __future__ import annotations

import argparse

from labkit.artifacts import zoo
from labkit.commands import add_json_flag, output, progress


def setup_arg_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="labkit models", description=__doc__)
    p.add_argument("names", nargs="*", help="zoo names or .gguf paths (default: every zoo model)")
    p.add_argument("--build", action="store_true", help="build every missing zoo model (default: list only)")
    p.add_argument("--rebuild", action="store_true", help="rebuild the named models even if cached")
    p.add_argument("--verify", action="store_true", help="recompute sha256 of the named models from their bytes")
    return add_json_flag(p)


def main(argv=None) -> int:
    args = setup_arg_parser().parse_args(argv)
    if not args.names:
        if args.build:
            progress("preparing every zoo model (embedded, derived, synthetic)")
        rows = zoo.list_models(build=args.build)
        output(args, lambda: lines(rows), {"models": rows})
        return 0
    rows = []
    for name in args.names:
        progress(f"preparing {name}")
        art = zoo.get(name, rebuild=args.rebuild)
        row = art.describe()
        if args.verify:
            actual = zoo.sha256_file(art.path)
            row["verified"] = actual == art.sha256
            row["sha256_actual"] = actual
        rows.append(row)
    output(args, lambda: lines(rows), {"models": rows})
    return 0 if all(r.get("verified", True) for r in rows) else 1


def lines(rows: list[dict]) -> list[str]:
    """One line per model: name, kind, size, sha256 (12 digits: --json has all 64), SYNTHETIC said."""
    out = []
    for r in rows:
        if not r.get("sha256"):
            out.append(f"{r.get('name')}: {r.get('kind')}, {r.get('status') or 'not built'}")
            continue
        check = {True: "; sha256 verified", False: f"; sha256 MISMATCH (now {str(r.get('sha256_actual'))[:12]}…)"}.get(
            r.get("verified"), "")
        size = f", {r['size'] / 1e6:.0f} MB" if r.get("size") else ""
        synth = "; SYNTHETIC: valid for cost only" if r.get("synthetic") else ""
        out.append(f"{r.get('name')}: {r.get('kind')}{size}, sha256 {r['sha256'][:12]}…{check}{synth}")
    return out or ["no models"]
