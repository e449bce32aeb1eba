"""Replay local journals into the tracking store: what ``labkit sync`` does.

A notebook run writes every record to a local journal (JSON lines) before it tries
MLflow (``labkit.lab.session``), and the files behind each table and figure to a folder
beside it. When the store goes away mid-run, the run carries on journal-only; when it is
back, ``sync`` puts into the store whatever the store does not have yet.

Idempotent by construction: every record is checked against the store before it is
written (a metric by (step, value) in its history, an artifact by path and size, a param
or tag by value), so syncing twice, or syncing a run that lost nothing, logs nothing.
A journal whose run is not in this store (another store, or a run never created) is
reported, not invented. A ``<journal>.synced`` note remembers a journal already fully
synced to a store, so old journals are not re-checked each time (``recheck`` ignores it).
"""

from __future__ import annotations

import json
from collections import defaultdict
from pathlib import Path

from labkit.paths import project_root
from labkit.provenance import runtags, tracking
from labkit.provenance.metric_keys import is_summary, summary_text


def find_journals(paths: list[str] | None = None) -> list[Path]:
    """Journals under the given files/folders, else the project's ``runs/`` and ``lab/journal/``."""
    roots = [Path(p) for p in paths] if paths else [project_root() / "runs", project_root() / "lab" / "journal"]
    out: list[Path] = []
    for r in roots:
        if r.is_file():
            out.append(r)
        elif r.is_dir():
            out += sorted(p for p in r.rglob("*.jsonl") if "artifacts" not in p.relative_to(r).parts)
    return list(dict.fromkeys(out))


def read_journal(path: Path) -> dict[str, list[dict]]:
    """Records by run key (``lab.run``), in order; a torn last line (a killed writer) is dropped."""
    runs: dict[str, list[dict]] = defaultdict(list)
    for line in path.read_text().splitlines():
        try:
            rec = json.loads(line)
        except json.JSONDecodeError:
            continue
        if isinstance(rec, dict) and rec.get("run"):
            runs[rec["run"]].append(rec)
    return dict(runs)


def sync(paths: list[str] | None = None, *, recheck: bool = False, progress=None) -> dict:
    """Replay every journal found into the tracking store; a summary of what was written."""
    c = tracking.client()
    uri = tracking.redact(tracking.tracking_uri())
    out = {"tracking_uri": uri, "journals": [], "written": 0, "missing_runs": []}
    for path in find_journals(paths):
        note = path.with_name(path.name + ".synced")
        size = path.stat().st_size
        if not recheck and note.exists():
            seen = json.loads(note.read_text() or "{}")
            if seen.get("tracking_uri") == uri and seen.get("size") == size:
                continue
        entry = {"journal": str(path), "runs": {}}
        for key, recs in read_journal(path).items():
            run = tracking.find_run(c, key, missing_ok=True)
            if run is None:
                out["missing_runs"].append({"journal": str(path), "run": key})
                continue
            counts = Replay(c, run, path.parent).apply(recs)
            entry["runs"][key] = counts
            out["written"] += sum(v for v in counts.values() if isinstance(v, int))
            if progress and any(counts.values()):
                progress(f"LAB:{key}: {', '.join(f'{k} {v}' for k, v in counts.items() if v)}")
        out["journals"].append(entry)
        if not any(m["journal"] == str(path) for m in out["missing_runs"]):
            note.write_text(json.dumps({"tracking_uri": uri, "size": size}))
    return out


class Replay:
    """Puts one run's journal records into the store, skipping what is already there."""

    def __init__(self, c, run, base: Path):
        self.c, self.run, self.base = c, run, base
        self.rid = run.info.run_id
        self._history: dict[str, set] = {}
        self._listing: dict[str, dict[str, int | None]] = {}
        self.counts = {"params": 0, "tags": 0, "metrics": 0, "artifacts": 0, "closed": 0}

    def apply(self, recs: list[dict]) -> dict:
        handlers = {"params": self.params, "engine": self.engine, "metric": self.metric, "cell": self.cell,
                    "table": self.produced, "figure": self.produced, "close": self.close,
                    "tags": lambda rec: self._tags(rec["tags"])}
        for rec in recs:
            fn = handlers.get(rec.get("type"))
            if fn is not None:
                fn(rec)
        return self.counts

    # -- one record type each ----------------------------------------------------------
    def params(self, rec: dict) -> None:
        have = self.run.data.params
        if "effective" in rec:  # what the session logged: tracking.effective_params
            want = dict(rec["effective"])
        else:  # journals written before effective params
            want = {k: json.dumps(v, default=str)[:6000] for k, v in rec["params"].items()}
            want.update({f"recipe.{k}": json.dumps(v, default=str)[:6000] for k, v in rec.get("recipe", {}).items()
                         if k not in rec["params"]})
        for k, v in want.items():
            if k not in have:
                self.c.log_param(self.rid, k, v)
                self.counts["params"] += 1
        self._tags(rec.get("tags", {}))

    def engine(self, rec: dict) -> None:
        prefix, desc = rec.get("prefix", ""), rec["describe"]
        self._tags({prefix + k: str(v)[:5000] for k, v in runtags.engine_tags(desc).items()})
        if f"{prefix}engine.json" not in self._files(""):
            tracking.log_json(self.c, self.rid, desc, f"{prefix}engine.json")
            self.counts["artifacts"] += 1

    def metric(self, rec: dict) -> None:
        if is_summary(rec["name"]):  # logged as a run tag (provenance/metric_keys.py)
            self._tags({rec["name"]: summary_text(rec["value"])})
            return
        step = rec.get("step") or 0
        self._metric(rec["name"], rec["value"], step)
        if rec.get("lo") is not None and rec.get("hi") is not None:
            self._metric(f"{rec['name']}.lo", rec["lo"], step)
            self._metric(f"{rec['name']}.hi", rec["hi"], step)

    def cell(self, rec: dict) -> None:
        idx = rec["index"]
        if f"cells/c{idx:03d}.json" not in self._files("cells"):
            clean = {k: v for k, v in rec.items() if k != "run"}  # the record as the session logged it
            tracking.log_json(self.c, self.rid, clean, f"cells/c{idx:03d}.json")
            self.counts["artifacts"] += 1
        if rec.get("duration_s") is not None:
            self._metric("lab/cell_duration_s", rec["duration_s"], idx)
        if int(self.run.data.tags.get("lab.cells", 0) or 0) < idx:
            self._tags({"lab.cells": str(idx)})

    def produced(self, rec: dict) -> None:
        folder = f"{rec['type']}s/{rec['name']}"
        local = self.base / "artifacts" / rec["run"] / folder
        if not local.is_dir():
            return  # nothing kept locally to replay (the spec alone is not the artifact)
        have = self._files(folder)
        if any(have.get(f"{folder}/{p.name}", -1) != p.stat().st_size for p in local.iterdir()):
            self.c.log_artifacts(self.rid, str(local), folder)
            self.counts["artifacts"] += 1

    def close(self, rec: dict) -> None:
        """The end of a run: its files, status tags, wall time, and terminal status."""
        apply_close(self.c, self.rid, rec, have=self._files("notebook"), history=self._metric_history("lab/seconds"),
                    run=self.run, counts=self.counts)

    # -- checks against the store ------------------------------------------------------
    def _tags(self, tags: dict) -> None:
        for k, v in tags.items():
            if self.run.data.tags.get(k) != str(v):
                self.c.set_tag(self.rid, k, str(v))
                self.run.data.tags[k] = str(v)
                self.counts["tags"] += 1

    def _metric_history(self, name: str) -> set:
        if name not in self._history:
            self._history[name] = {(m.step, m.value) for m in self.c.get_metric_history(self.rid, name)}
        return self._history[name]

    def _metric(self, name: str, value: float, step: int) -> None:
        seen = self._metric_history(name)
        if (step, float(value)) not in seen:
            self.c.log_metric(self.rid, name, float(value), step=step)
            seen.add((step, float(value)))
            self.counts["metrics"] += 1

    def _files(self, folder: str) -> dict[str, int | None]:
        if folder not in self._listing:
            try:
                self._listing[folder] = {a.path: a.file_size for a in self.c.list_artifacts(self.rid, folder or None)}
            except Exception:  # a folder never logged lists as an error on some stores
                self._listing[folder] = {}
        return self._listing[folder]


def apply_close(c, rid: str, rec: dict, *, have: dict | None = None, history: set | None = None, run=None,
                counts: dict | None = None) -> None:
    """Close a run: log its executed notebook and journal, its status tags and wall time,
    and terminate it. With ``have``/``history``/``run`` (what the store holds), skip what is
    there; ``reproduce`` calls it plainly at the end of each notebook."""
    counts = counts if counts is not None else defaultdict(int)
    for f in rec.get("files", []):
        p = Path(f)
        if p.exists() and (have is None or have.get(f"notebook/{p.name}", -1) != p.stat().st_size):
            c.log_artifact(rid, str(p), "notebook")
            counts["artifacts"] += 1
    tags = {"lab.status": rec["status"], **({"lab.error": rec["error"][:5000]} if rec.get("error") else {}),
            **{k: str(v)[:5000] for k, v in (rec.get("tags") or {}).items()}}
    for k, v in tags.items():
        if run is None or run.data.tags.get(k) != v:
            c.set_tag(rid, k, v)
            counts["tags"] += 1
    if rec.get("seconds") is not None and not history:
        c.log_metric(rid, "lab/seconds", rec["seconds"])
        counts["metrics"] += 1
    if run is None or run.info.status != rec["status"]:
        c.set_terminated(rid, rec["status"])
        counts["closed"] += 1
