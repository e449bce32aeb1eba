"""``labkit show``: what a ``[LAB: …]`` ID points at: its run, cell or artifacts, with
parameters and provenance. Reads the store only.
"""

from __future__ import annotations

import json

from labkit.errors import LabkitError
from labkit.provenance import ids, tracking
from labkit.provenance.tracking import _artifacts, _find_part


def show(lab_id: str) -> dict:
    """What an ID points at: run, cell or artifact, with parameters and provenance."""
    lid = ids.parse_id(lab_id)
    c = tracking.client()
    run = tracking.find_run(c, lid.run)
    rid = run.info.run_id
    tags = run.data.tags
    out = {
        "id": str(lid), "run_id": rid, "experiment": c.get_experiment(run.info.experiment_id).name,
        "status": run.info.status, "notebook": tags.get("lab.notebook"), "recipe": tags.get("recipe"),
        "recipe_hash": tags.get("recipe.effective_hash"),
        "parameters": json.loads(tags.get("papermill.parameters", "{}")),
        "provenance": {k: v for k, v in tags.items() if k.split(".")[0] in
                       ("git", "host", "engine", "model", "recipe", "residency", "draft")},
        "metrics": run.data.metrics, "tracking_uri": tracking.redact(tracking.tracking_uri()),
        # arms of long measurements: done / planned (and, resumed, inherited and drift)
        "arms": {k[len("arms."):]: v for k, v in tags.items() if k.startswith("arms.")},
        "resumed_from": tags.get("resume.from"),
    }
    if lid.part and lid.part[0] == "c" and lid.part[1:].isdigit():
        out["cell"] = tracking.load_json_artifact(c, rid, f"cells/c{int(lid.part[1:]):03d}.json")
        out["artifacts"] = _find_part(c, run, lid.part)
    elif lid.part:
        specs = _find_part(c, run, lid.part)
        if not specs:
            raise LabkitError(f"run {lid.run} has no figure, table or cell named {lid.part!r}",
                              "`labkit show LAB:<run>` lists what the run produced")
        out["artifact"] = specs[0]
    else:
        out["produced"] = [p for k in ("figures", "tables") for p in _artifacts(c, rid, k)]
        out["cells"] = len(_artifacts(c, rid, "cells"))
    return out
