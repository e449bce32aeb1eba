"""``labkit regen LAB:…``: regenerate a figure or table from its logged data alone and
report whether the regenerated data is identical; with --rerun, execute the notebook
again with the same parameters and compare the new figure with the old within noise.
A document section ("LAB:RESULTS-MATRIX §E") is redrawn from the logged runs and
compared with the copy notebook 06 logged, when there is one."""

from __future__ import annotations

import argparse
from pathlib import Path

from labkit.commands import add_json_flag, output, progress
from labkit.paths import project_root
from labkit.provenance import ids


def setup_arg_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="labkit regen", description=__doc__)
    p.add_argument("id", help='LAB:<run>/<figure-or-table name>, LAB:<run>/cN or "LAB:RESULTS-MATRIX §E"')
    p.add_argument("--rerun", action="store_true", help="re-execute the notebook and compare within noise")
    p.add_argument("--out", default=None, help="where regenerated files go (default: runs/regen)")
    p.add_argument("--recipe", default=None, help="for a worksheet section: the recipe (default: default)")
    return add_json_flag(p)


def main(argv=None) -> int:
    args = setup_arg_parser().parse_args(argv)
    out = Path(args.out) if args.out else project_root() / "runs" / "regen"
    ref = ids.parse_ref(args.id)
    if isinstance(ref, ids.SectionId):
        from labkit.config.recipe import load, resolve
        from labkit.errors import LabkitError
        from labkit.provenance import tracking
        from labkit.report import sections

        if args.rerun:
            raise LabkitError(f"{ref} is built from many runs; --rerun re-executes one notebook run",
                              "regen the section without --rerun, or rerun a run it cites (labkit show lists them)")
        res = sections.regen(tracking.client(), ref, out_dir=out, recipe=resolve(load(args.recipe)))
        same = {True: "identical to", False: "DIFFERS from", None: "no logged copy to compare with"}[res["identical"]]
        output(args, [f"[{res['id']}] redrawn from {len(res['sources'])} run(s), {res['rows']} rows: {same}"
                      + (f" [{res['compared_with']}]" if res["compared_with"] else ""),
                      *(f"  {f}" for f in res["files"])], res)
        return 0 if res["identical"] is not False else 1
    from labkit.report.regen import regen

    res = regen(args.id, out_dir=out, rerun=args.rerun, progress=progress)
    output(args, lambda: lines(res), res)
    ok = res["identical"] and (not args.rerun or res["rerun"]["within_noise"])
    return 0 if ok else 1


def lines(res: dict) -> list[str]:
    """Identical or not first, per figure/table, then where the files are; the rerun's verdict."""
    out = [f"[{res['id']}]: " + ("regenerated identical to what was logged" if res["identical"]
                                 else "regenerated data DIFFERS from what was logged")]
    for r in res["regenerated"]:
        same = "identical" if r["identical"] else ("data identical, drawing differs" if r.get("data_identical")
                                                  else "data differs")
        out.append(f"  {r['type']} [{r['id']}]: {same}; {', '.join(r['files'])}")
    rr = res.get("rerun")
    if rr:
        out.append(f"rerun [{rr['new_id']}] {rr['status']}: " + ("within noise" if rr["within_noise"] else
                                                                "NOT within noise: --json has every check"))
        for cmp_ in rr.get("comparisons") or []:
            if not cmp_["within_noise"]:
                out.append(f"  {cmp_['name']}: " + (cmp_.get("reason") or ", ".join(
                    f"{ch['column']} {ch['outside']}/{ch['rows']} outside {ch['basis']}" for ch in cmp_["checks"]
                    if ch["outside"])))
    return out
