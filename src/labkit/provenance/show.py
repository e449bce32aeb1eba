"""``labkit show``: what a ``[LAB: …]`` ID points at: its run, cell or artifacts, with
parameters and provenance. Reads the store only.

``show`` is the whole record (``labkit show --json``); ``summary_lines`` is what a person
reads first: what ran where and when, what it found (its verdict lines and the metrics
logged with an interval), what it produced by ID, and where to see more.
"""

from __future__ import annotations

import json
import time

from labkit.errors import LabkitError
from labkit.provenance import ids, tracking
from labkit.provenance.metric_keys import canonical_metrics
from labkit.provenance.tracking import _artifacts, _find_part

VERDICT_TAGS = (".line", ".verdict", ".summary", ".winner")  # tags that say what a run found, in words
VERDICT_TABLES = ("speedup-forest", "concurrency-forest", "power-comparison")  # a CI and verdict per arm
HEADLINE_ROWS = 10  # verdict rows the summary lists; the table has them all
HEADLINE_METRICS = 6  # ranged metrics the summary lists; --json has every metric


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
        "provenance": {k: v for k, v in sorted(tags.items()) if k.split(".")[0] in
                       ("git", "host", "engine", "model", "recipe", "residency", "draft")},
        "metrics": dict(sorted(run.data.metrics.items())),  # the store's order is not stable (a restore reorders it)
        "tracking_uri": tracking.redact(tracking.tracking_uri()),
        # arms of long measurements: done / planned (and, resumed, inherited and drift)
        "arms": {k[len("arms."):]: v for k, v in sorted(tags.items()) if k.startswith("arms.")},
        "resumed_from": tags.get("resume.from"),
        "started": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime(run.info.start_time / 1000)),
        "host": tags.get("host.label") or tags.get("host.hostname"),
        "found": {k: v for k, v in sorted(tags.items()) if k.endswith(VERDICT_TAGS) and v},
        "ui": ui_link(run.info.experiment_id, rid),
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
        out["verdicts"] = verdict_lines(c, rid, out["produced"])
        out["notebook_html"] = next((p for p in _artifacts(c, rid, "notebook") if p.endswith(".html")), None)
    return out


def ui_link(experiment_id: str, run_id: str) -> str:
    """The run's page in the MLflow UI: the tracking server's, else ``labkit ui``'s default port."""
    uri = tracking.tracking_uri()
    base = uri.rstrip("/") if uri.startswith("http") else "http://127.0.0.1:5000"
    return f"{base}/#/experiments/{experiment_id}/runs/{run_id}"


def verdict_lines(c, run_id: str, produced: list[str]) -> list[str]:
    """Each arm of the run's verdict tables (its forest: ratio, CI, verdict, unit, pairs) as a line."""
    from labkit.provenance import frames

    out = []
    for name in VERDICT_TABLES:
        if f"tables/{name}" not in produced:
            continue
        df = frames.frame_from_json(tracking.read_artifact(c, run_id, f"tables/{name}/data.json"))
        for r in df.to_dict("records"):
            if r.get("line"):  # the power comparison writes its own
                out.append(str(r["line"]))
                continue
            lo, hi, ratio = r.get("lo"), r.get("hi"), r.get("ratio")
            if ratio is None or ratio != ratio:
                continue
            ci = (f"{r.get('confidence') or 0.95:.0%} CI {lo:.2f}–{hi:.2f}" if hi is not None and hi == hi
                  and hi != float("inf") else "one pair: no CI")
            n = r.get("pairs", r.get("rounds"))
            out.append(f"{r['label']}: {ratio:.2f}× ({ci}), {r['verdict']}; {r.get('basis') or 'ratio'}"
                       + (f", {int(n)} pair{'s' if n != 1 else ''}" if n is not None and n == n else ""))
    return out


def _num(v: float) -> str:
    """A metric for reading: three significant figures or so, never in exponent notation."""
    return f"{v:.0f}" if abs(v) >= 100 else f"{v:.2f}" if abs(v) >= 1 else f"{v:.3f}"


def _found(d: dict) -> list[str]:
    """The run's verdicts in words (its *.line / *.verdict tags), then metrics with an interval."""
    out = []
    for k, v in d["found"].items():
        try:  # per-drafter verdicts and the protocol's winner are JSON objects
            obj = json.loads(v)
        except ValueError:
            obj = None
        if k.endswith(".verdict") and f"{k[:-len('verdict')]}line" in d["found"]:
            continue  # its line says it, with the interval
        if k == "protocol.winner" and isinstance(obj, dict):
            out.append(f"protocol winner: {obj.get('drafter')} k={obj.get('k')}" if obj.get("k")
                       else "protocol winner: none (speculation off)")
        elif isinstance(obj, dict):
            out += [f"{k} {name}: {text}" for name, text in obj.items()]
        else:  # a long line of "; "-joined verdicts: one each
            out += [f"{k}: {part}" for part in str(v).split("; ")] if len(str(v)) > 200 else [f"{k}: {v}"]
    rows = d.get("verdicts") or []
    out += rows[:HEADLINE_ROWS]
    if len(rows) > HEADLINE_ROWS:
        out.append(f"… {len(rows) - HEADLINE_ROWS} more verdicts: labkit export {d['id']}/<forest table> --format md")
    m = canonical_metrics(d["metrics"])
    ranged = [k for k in sorted(m) if f"{k}.lo" in m and f"{k}.hi" in m and not k.startswith(("lab/", "system/"))]
    for k in ranged[:HEADLINE_METRICS]:
        out.append(f"{k} = {_num(m[k])} (range {_num(m[f'{k}.lo'])}–{_num(m[f'{k}.hi'])})")
    if len(ranged) > HEADLINE_METRICS:
        out.append(f"… {len(ranged) - HEADLINE_METRICS} more metrics with ranges: --json")
    return out


def summary_lines(d: dict) -> list[str]:
    """``show``'s record as a person reads it (each line short; the record itself is --json)."""
    head = (f"[{d['id']}] {d['notebook'] or 'run'} · {d['status']} · recipe {d['recipe']} · host {d['host']} · "
            f"{d['started']}")
    lines = [head]
    if d.get("artifact"):
        a = d["artifact"]
        lines.append(f"{a.get('type', 'artifact')} {a.get('name')!r} of this run"
                     + (f": {a['title']}" if a.get("title") else ""))
        verb = "regen" if a.get("type") == "figure" else "export"
        lines.append(f"see more: labkit {verb} {d['id']} · labkit show {d['id'].split('/')[0]} (the run) · --json")
        return lines
    if d.get("cell") is not None:
        lines.append(f"cell {d['id'].split('/')[-1]}: {len(d.get('artifacts') or [])} figure(s)/table(s)"
                     + "; --json has the cell's record")
        return lines
    found = _found(d)
    lines += ["found:", *(f"  {x}" for x in found)] if found else ["found: no verdict or ranged metric logged"]
    if d.get("arms"):
        lines.append("arms: " + ", ".join(f"{k} {v}" for k, v in d["arms"].items()))
    if d.get("resumed_from"):
        lines.append(f"resumed from [{d['resumed_from']}]")
    produced = d.get("produced") or []
    lines.append(f"produced: {len(produced)} figure(s)/table(s), {d.get('cells', 0)} cell(s)")
    lines += [f"  {p.split('/')[0][:-1]:<6} [{d['id']}/{p.split('/')[-1]}]" for p in produced]
    if d.get("notebook_html"):
        lines.append(f"executed notebook: artifact {d['notebook_html']} of run {d['run_id']} (labkit ui → Artifacts)")
    lines.append(f"see more: labkit show {d['id']} --json · labkit export {d['id']}/<table> --format md · {d['ui']}")
    return lines
