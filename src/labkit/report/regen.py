"""Resolve ``[LAB: …]`` IDs: show what they point at, regenerate figures and tables.

``regen`` redraws from the logged data alone (no measurement) and says whether the
data drawn is identical to what was drawn originally; ``regen --rerun`` executes the
notebook again with the same parameters and compares the new figure's data with the
old one within the recorded noise.
"""

from __future__ import annotations

import json
from pathlib import Path

from labkit.errors import LabkitError
from labkit.provenance import frames, ids, tracking
from labkit.provenance.tracking import _find_part

REL_TOL = 0.10  # for drawn values without a recorded range


def _load_frame(c, run_id: str, path: str):
    return frames.frame_from_json(tracking.read_artifact(c, run_id, path))


def regen_one(c, run_id: str, spec: dict, out_dir: Path) -> dict:
    folder = f"{'figures' if spec['type'] == 'figure' else 'tables'}/{spec['name']}"
    data = _load_frame(c, run_id, f"{folder}/data.json")
    data_same = frames.digest(frames.frame_to_json(data)) == spec["data_sha256"]
    res = {"id": spec["id"], "type": spec["type"], "name": spec["name"], "data_identical": data_same}
    dest = out_dir / spec["id"].replace(":", "_").replace("/", "__")
    dest.mkdir(parents=True, exist_ok=True)
    if spec["type"] == "table":
        data.to_csv(dest / "table.csv", index=False)
        res["identical"] = data_same
        res["files"] = [str(dest / "table.csv")]
        return res
    import matplotlib.pyplot as plt

    from labkit.report import figures  # matplotlib loads only when something is drawn

    fig, drawn = figures.render(spec["kind"], data, **spec.get("kwargs", {}))
    figures.stamp(fig, spec["id"] + " · regenerated")
    paths = figures.save(fig, dest, lab_id=spec["id"], title=spec["name"] + " (regenerated)")
    plt.close(fig)
    res["drawn_identical"] = frames.digest(frames.frame_to_json(drawn)) == spec["drawn_sha256"]
    res["identical"] = data_same and res["drawn_identical"]
    res["files"] = [str(p) for p in paths.values()]
    return res


def regen(lab_id: str, *, out_dir: Path, rerun: bool = False, progress=None) -> dict:
    lid = ids.parse_id(lab_id)
    if not lid.part:
        raise LabkitError(f"{lid} names a whole run", "name a figure or table (LAB:<run>/<name>) or a cell (/cN)")
    c = tracking.client()
    run = tracking.find_run(c, lid.run)
    specs = _find_part(c, run, lid.part)
    if not specs:
        raise LabkitError(f"run {lid.run} has no figure or table for {lid.part!r}",
                          "`labkit show LAB:<run>` lists what the run produced")
    results = [regen_one(c, run.info.run_id, s, out_dir) for s in specs]
    out = {"id": str(lid), "run_id": run.info.run_id, "regenerated": results,
           "identical": all(r["identical"] for r in results)}
    if rerun:
        out["rerun"] = _rerun(c, run, specs, out_dir, progress)
    return out


def _rerun(c, run, specs: list[dict], out_dir: Path, progress) -> dict:
    from labkit.provenance.reproduce import discover, reproduce

    params = json.loads(run.data.tags.get("papermill.parameters", "{}"))
    nb = run.data.tags.get("lab.notebook")
    if not nb:
        raise LabkitError("the run records no notebook", "only runs made by notebooks can be rerun")
    discover([nb])
    summary = reproduce(recipe=params.pop("recipe", None), only=[nb], out_dir=str(out_dir / "rerun"),
                        params=params, progress=progress, auto_resume=False)  # a rerun re-measures
    res = summary["results"][0]
    if res["status"] != "FINISHED":
        return {"new_id": res["id"], "status": res["status"], "error": res["error"], "within_noise": False}
    new_run = c.get_run(res["run_id"])
    comps = []
    for spec in specs:
        new_specs = _find_part(c, new_run, spec["name"])
        if not new_specs:
            comps.append({"name": spec["name"], "within_noise": False, "reason": "not produced by the rerun"})
            continue
        kind = "figures" if spec["type"] == "figure" else "tables"
        which = "drawn.json" if spec["type"] == "figure" else "data.json"
        old = _load_frame(c, run.info.run_id, f"{kind}/{spec['name']}/{which}")
        new = _load_frame(c, res["run_id"], f"{kind}/{spec['name']}/{which}")
        comps.append({"name": spec["name"], "new_id": new_specs[0]["id"],
                      **compare_frames(old, new, noise=spec.get("noise", {}))})
    return {"new_id": res["id"], "status": "FINISHED", "comparisons": comps,
            "within_noise": all(x["within_noise"] for x in comps)}


def compare_frames(old, new, *, noise: dict, rel_tol: float = REL_TOL) -> dict:
    """Row-by-row comparison of two drawn frames.

    ``noise`` maps a value column to its recorded [low, high] columns: the new value must
    fall inside the old range widened to at least ``rel_tol``; columns without a range
    must agree within ``rel_tol``. Non-numeric columns (and ``noise['key']``) match rows.
    """
    import numpy as np

    keys = noise.get("key") or [c for c in old.columns if not np.issubdtype(old[c].dtype, np.number)]
    if keys:
        merged = old.merge(new, on=keys, how="outer", suffixes=("_old", "_new"), indicator=True)
    else:
        if len(old) != len(new):
            return {"within_noise": False, "reason": f"{len(old)} rows before, {len(new)} now"}
        merged = old.add_suffix("_old").join(new.add_suffix("_new"))
        merged["_merge"] = "both"
    if (merged["_merge"] != "both").any():
        return {"within_noise": False, "reason": "rows differ between the runs"}
    bounds = {lo for pair in noise.values() if isinstance(pair, list) for lo in pair}
    checks = []
    for col in old.columns:
        if col in keys or col in bounds or not np.issubdtype(old[col].dtype, np.number):
            continue
        o, n = merged[f"{col}_old"].astype(float), merged[f"{col}_new"].astype(float)
        if col in noise:
            lo_c, hi_c = noise[col]
            lo, hi = merged[f"{lo_c}_old"].astype(float), merged[f"{hi_c}_old"].astype(float)
            slack = rel_tol * o.abs()
            ok = (n >= np.minimum(lo, o - slack)) & (n <= np.maximum(hi, o + slack))
            basis = f"old range [{lo_c}, {hi_c}] (at least ±{rel_tol:.0%})"
        else:
            ok = (n - o).abs() <= rel_tol * o.abs() + 1e-12
            basis = f"±{rel_tol:.0%}"
        checks.append({"column": col, "basis": basis, "rows": int(len(ok)), "outside": int((~ok).sum()),
                       "max_rel_change": float(((n - o).abs() / o.abs().clip(lower=1e-12)).max())})
    return {"within_noise": all(ch["outside"] == 0 for ch in checks), "checks": checks}
