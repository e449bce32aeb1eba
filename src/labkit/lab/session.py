"""The notebook side of provenance: one MLflow run per notebook run, every cell logged.

A notebook's second cell is ``lab = labkit.lab.start(globals())``. From then on an
IPython ``post_run_cell`` hook logs each executed cell (index, source hash, duration,
status, and the metrics, tables and figures it produced) under its ``[LAB: …]`` ID.
Cells that ran before ``start`` (the parameters) are logged from the kernel's history.

Under ``labkit reproduce`` the run already exists (``LABKIT_RUN_ID``); interactively,
``start`` creates it. Each record goes first to a local journal (JSON lines) and then
to MLflow, so a tracking store that fails mid-run loses nothing already measured.

An interactive run (JupyterLab, VS Code, a console) is named after its notebook
(``lab.notebook``) and closes itself, since no notebook calls ``finish()``:

- when the notebook's last code cell has run: FINISHED, or FAILED while a cell that
  raised has not since run without error;
- running any cell after that continues the same run (RUNNING again, said in the
  output) until the last cell runs again;
- on kernel shutdown or restart (``atexit``), the same rule closes a run still open;
- running ``start()`` again in the same kernel closes the current run by that rule and
  begins a new one (a new LAB ID), both said in the output.
"""

from __future__ import annotations

import atexit
import hashlib
import json
import os
import sys
import tempfile
import time
import traceback
from pathlib import Path

from labkit.config.recipe import Recipe, effective_recipe, resolve
from labkit.errors import LabkitError
from labkit.lab import notebook as nbinfo
from labkit.lab import upstream
from labkit.lab.ipython import _assigned_names, _display, _display_md, _ipython, _jsonable
from labkit.lab.progress import Progress, widgets_frontend
from labkit.paths import project_root
from labkit.provenance import arms as arm_journal
from labkit.provenance import fingerprint, frames, ids, resume, run_page, runtags, tracking
from labkit.provenance.metric_keys import is_summary, summary_text
from labkit.report import figures
from labkit.teardown import freeze_at_exit

_SESSION: Lab | None = None
OFFLINE_PROBE_S = 30.0


def _sha(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()[:12]


class Lab:
    """The provenance session of one notebook run."""

    def __init__(self, *, notebook: str, recipe: Recipe, params: dict, run_id: str | None = None,
                 lab_run: str | None = None, where: nbinfo.Notebook | None = None):
        self.notebook = notebook
        self.where = where or nbinfo.Notebook(notebook, "given")
        self.status = "RUNNING"  # of an interactive run: RUNNING until closed (see the module doc)
        self._failed: dict[str, str] = {}  # cell key -> error, for cells that raised and were not re-run OK
        self._found: dict[str, float] = {}  # metric -> last value, for the run's description
        self.recipe = recipe
        self.params = params
        # under reproduce the run exists already: a server away now is the journal's job
        self.client = tracking.client(check=run_id is None)
        self.owns_run = run_id is None
        if self.owns_run:
            prov = fingerprint.collect(recipe=recipe)
            tags = {**runtags.flat_tags(prov), "papermill.parameters": json.dumps(params, default=str),
                    "lab.mode": "interactive", "lab.notebook": notebook, "lab.pid": os.getpid(),
                    upstream.USER_TAG: upstream.user()}
            session = upstream.jupyter_session()
            if session:  # what a downstream notebook of the same JupyterLab reads (lab/upstream.py)
                tags[upstream.SESSION_TAG] = session
            source = str(self.where.path) if self.where.path else None
            self.run_id, self.id = tracking.new_run(self.client, notebook=notebook, recipe=recipe, tags=tags,
                                                    source=source)
            tracking.log_json(self.client, self.run_id, prov, "fingerprint.json")
        else:
            self.run_id, self.id = run_id, ids.LabId(lab_run)
        journal = os.environ.get("LABKIT_JOURNAL")
        self.journal = Path(journal) if journal else project_root() / "lab" / "journal" / f"{self.id.run}.jsonl"
        self.journal.parent.mkdir(parents=True, exist_ok=True)
        self.n_cells = 0
        self._t0: float | None = None
        self._produced: dict = {}
        # (kind, name): a figure and the table of its data may share a name (one ID, both
        # found by `labkit show`); two figures or two tables may not
        self._names: set[tuple[str, str]] = set()
        self._mlflow_error: str | None = None
        self._book: arm_journal.ArmBook | None = None  # the arms of long measurements (see arms())
        self._engine_tags: dict = {}
        self._offline_since: float | None = None  # MLflow failed: journal only, re-probed now and then
        # progress=lab.progress and the arm book: a live bar in JupyterLab, text lines elsewhere
        self.progress = Progress(live=widgets_frontend(_ipython()))
        self._log_params()
        if not self.owns_run:  # whether a RUNNING run's writer is gone (see provenance.resume)
            self._mlflow(lambda: self.client.set_tag(self.run_id, "lab.kernel_pid", str(os.getpid())))

    # -- what notebooks call -----------------------------------------------------------
    def cite(self, part: str | None = None) -> str:
        return (self.id.child(part) if part else self.id).cite

    def engine(self, *, draft: bool = False, load_mtp: bool | None = None, **kw):
        """Open the recipe's engine and tag the run with its build, flags, model and residency.
        The target opens with the MTP context whenever the recipe's drafters need it
        (``load_mtp=None``), so every notebook can run ``mtp``; ``kw``: ``n_seq_max``,
        ``n_ctx`` per sequence, for the multi-slot loop."""
        from labkit.config.runtime import open_engine, open_target

        if draft:
            e = open_engine(self.recipe, draft=True, load_mtp=bool(load_mtp), **kw)
        elif load_mtp is None:
            e = open_target(self.recipe, **kw)
        else:
            e = open_engine(self.recipe, load_mtp=load_mtp, **kw)
        desc = e.describe()
        prefix = "draft." if draft else ""
        if not draft:
            self._engine_tags = runtags.engine_tags(desc)
        self._journal({"type": "engine", "prefix": prefix, "describe": desc})
        self._mlflow(lambda: [self.client.set_tag(self.run_id, prefix + k, str(v)[:5000])
                              for k, v in runtags.engine_tags(desc).items()])
        self._mlflow(lambda: tracking.log_json(self.client, self.run_id, desc, f"{prefix}engine.json"))
        return e

    def tags(self, tags: dict) -> dict:
        """Set run tags (values cut to MLflow's 5000 characters; a None value sets no tag):
        journaled first, so a store that is away loses nothing (``labkit sync`` replays them);
        returns them."""
        tags = {k: str(v)[:5000] for k, v in tags.items() if v is not None}
        self._journal({"type": "tags", "tags": tags})
        self._mlflow(lambda: tracking.set_tags(self.client, self.run_id, tags))
        return tags

    def skip_if(self, condition: bool, reason: str) -> bool:
        """When ``condition`` holds, record that the rest of this notebook does not apply and why
        (run tag ``lab.skipped``, the journal, stdout); the notebook's later cells check the result."""
        if condition:
            print(f"SKIPPED: {reason}")
            self._journal({"type": "skipped", "reason": reason})
            self._mlflow(lambda: self.client.set_tag(self.run_id, "lab.skipped", reason[:5000]))
        return bool(condition)

    def metric(self, name: str, value: float, *, lo: float | None = None, hi: float | None = None,
               step: int | None = None) -> float:
        """Log a metric, with its recorded range (lo, hi) when it has one. A one-value summary
        (``best/…``: ``metric_keys.is_summary``) becomes a run tag, shown as a value, not a chart."""
        entry = {"name": name, "value": float(value), "lo": lo, "hi": hi, "step": step}
        self._produced.setdefault("metrics", []).append(entry)
        self._found[name] = float(value)
        if lo is not None and hi is not None:
            self._found.update({f"{name}.lo": float(lo), f"{name}.hi": float(hi)})
        self._journal({"type": "metric", **entry})
        if is_summary(name):
            self._mlflow(lambda: self.client.set_tag(self.run_id, name, summary_text(value)))
            return value

        def log():
            self.client.log_metric(self.run_id, name, float(value), step=step or 0)
            if lo is not None and hi is not None:
                self.client.log_metric(self.run_id, f"{name}.lo", float(lo), step=step or 0)
                self.client.log_metric(self.run_id, f"{name}.hi", float(hi), step=step or 0)

        self._mlflow(log)
        return value

    def metrics(self, rows) -> None:
        """Log many metrics: dicts with name, value and optionally lo, hi, step (or a
        mapping name -> (value, lo, hi))."""
        if isinstance(rows, dict):
            rows = [{"name": n, "value": v[0], "lo": v[1], "hi": v[2]} for n, v in rows.items()]
        for r in rows:
            self.metric(r["name"], r["value"], lo=r.get("lo"), hi=r.get("hi"), step=r.get("step"))

    def table(self, name: str, df, *, noise: dict | None = None, display: bool = True):
        """Log a table (its exact data, a CSV, and its ID) and show it."""
        lab_id = str(self.id.child(self._unique(name, "table")))
        text = frames.frame_to_json(df)
        spec = {"type": "table", "name": name, "id": lab_id, "cell": self.n_cells + 1,
                "data_sha256": frames.digest(text), "noise": noise or {}}
        self._artifact(f"tables/{name}", {"data.json": text, "table.csv": df.to_csv(index=False),
                                          "spec.json": json.dumps(spec, indent=1)})
        # the same rows for MLflow's own table view and mlflow.load_table (data.json stays the exact record)
        self._mlflow(lambda: self.client.log_table(self.run_id, data=df, artifact_file=f"tables/{name}/table.json"))
        self._produced.setdefault("tables", []).append(spec)
        self._journal({"type": "table", **spec})
        if display:
            _display_md(f"`[{lab_id}]`")
            _display(df)
        return df

    def figure(self, kind: str, data, *, name: str, noise: dict | None = None, display: bool = True, **kw):
        """Draw a registered figure from ``data``, stamp it, log PNG/SVG + data + spec, show it."""
        import matplotlib.pyplot as plt

        lab_id = str(self.id.child(self._unique(name, "figure")))
        fig, drawn = figures.render(kind, data, **kw)
        figures.stamp(fig, lab_id)
        data_text, drawn_text = frames.frame_to_json(data), frames.frame_to_json(drawn)
        spec = {"type": "figure", "kind": kind, "name": name, "id": lab_id, "cell": self.n_cells + 1,
                "kwargs": kw, "data_sha256": frames.digest(data_text), "drawn_sha256": frames.digest(drawn_text),
                "noise": noise or {}}
        with tempfile.TemporaryDirectory() as d:
            paths = figures.save(fig, Path(d), lab_id=lab_id, title=name)
            files = {p.name: p.read_bytes() for p in paths.values()}
        files.update({"data.json": data_text, "drawn.json": drawn_text, "spec.json": json.dumps(spec, indent=1)})
        self._artifact(f"figures/{name}", files)
        self._produced.setdefault("figures", []).append(spec)
        self._journal({"type": "figure", **spec})
        if display:
            _display(fig)
        plt.close(fig)
        return lab_id

    def arms(self, kind: str) -> dict:
        """``on_arm`` and ``skip`` for a long measurement, to pass through:
        ``sweep.k_sweep(..., **lab.arms("sweep"))``. Each arm it finishes is journaled
        (locally, then to MLflow) as it finishes; when this run resumes an interrupted one
        (``labkit reproduce --resume``), the arms that run kept are inherited and skipped,
        after checking that the recipe, commit, model and engine build are the same."""
        if self._book is None:
            self._book = arm_journal.ArmBook(client=self.client, run_id=self.run_id, run_key=self.id.run,
                                             journal=self._journal, mlflow=self._mlflow,
                                             bar=self.progress.arms if self.progress.live else None)
        skip = {}
        source = os.environ.get("LABKIT_RESUME_FROM")
        if source:
            prev = self.client.get_run(source)
            resume.check(prev, resume.identity(self.recipe, commit=fingerprint.git_info()["commit"],
                                               engine_tags=self._engine_tags))
            entries = arm_journal.read_arms(self.client, prev, kind)
            skip = self._book.inherit(kind, entries, source=prev.data.tags.get("lab.run", source))
        return {"on_arm": self._book.on_arm(kind), "skip": skip}

    def _arms_drift(self) -> None:
        """After a cell: for each kind of arm completed across a resume, the drift table."""
        import pandas as pd

        for kind in self._book.drift_due() if self._book is not None else []:
            seams = arm_journal.drift_table(self._book.rows_in_order(kind))
            self._book.kind(kind).drift = seams
            if not seams:
                continue
            self.table(f"arms-drift-{kind}", pd.DataFrame(seams), display=False)
            moved = [s for s in seams if s["moved"]]
            verdict = ("moved: " + ", ".join(f"x{s['ratio']:.2f} (band ±{s['band']:.0%})" for s in moved)
                       if moved else "within noise")
            self._mlflow(lambda v=verdict, t=f"arms.drift.{kind}": self.client.set_tag(self.run_id, t, v))
            if moved or not any(s["moved"] for k in self._book.kinds.values() for s in k.drift):
                self._mlflow(lambda v=verdict: self.client.set_tag(self.run_id, "arms.drift", v))
            print(f"labkit.lab: arms {kind} across the resume: plain tok/s {verdict}", file=sys.stderr)

    # -- cell hooks ----------------------------------------------------------------------
    def _pre(self, info=None) -> None:
        self._t0 = time.perf_counter()
        self._produced = {}
        if self.owns_run and self.status != "RUNNING":
            self._reopen()

    def _post(self, result) -> None:
        info = getattr(result, "info", None)
        source = info.raw_cell if info is not None else ""
        cell_id = getattr(info, "cell_id", None)
        err = result.error_in_exec or result.error_before_exec
        status = "ok" if err is None else "error"
        duration = time.perf_counter() - self._t0 if self._t0 is not None else None
        self._arms_drift()
        error = None if err is None else f"{type(err).__name__}: {err}"
        self._log_cell(source, status=status, duration=duration, error=error, cell_id=cell_id)
        self._t0 = None
        self.progress.cell_done()
        if self.owns_run:
            key = cell_id or _sha(source)
            self._failed.pop(key, None) if err is None else self._failed.__setitem__(key, error)
            if self.where.is_last_cell(cell_id, source):
                self.close(why="the notebook's last cell ran")

    def _log_cell(self, source: str, *, status: str, duration: float | None, error: str | None = None,
                  note: str | None = None, cell_id: str | None = None) -> None:
        self.n_cells += 1
        idx = self.n_cells
        rec = {
            "type": "cell", "index": idx, "id": str(self.id.child(f"c{idx}")), "source_sha256": _sha(source),
            "source": source, "duration_s": duration, "status": status, "error": error, "note": note,
            "produced": self._produced, "time": time.strftime("%Y-%m-%dT%H:%M:%S"), "cell_id": cell_id,
        }
        self._journal(rec)

        def log():
            tracking.log_json(self.client, self.run_id, rec, f"cells/c{idx:03d}.json")
            if duration is not None:
                self.client.log_metric(self.run_id, "lab/cell_duration_s", duration, step=idx)
            self.client.set_tag(self.run_id, "lab.cells", str(idx))

        self._mlflow(log)
        self._produced = {}

    # -- plumbing ------------------------------------------------------------------------
    def _unique(self, name: str, kind: str) -> str:
        if (kind, name) in self._names:
            raise LabkitError(f"{kind} name {name!r} is used twice in this notebook", f"give each {kind} a distinct name")
        if name.startswith("c") and name[1:].isdigit():
            raise LabkitError(f"name {name!r} looks like a cell ID", "choose a descriptive name such as 'cost-fit'")
        self._names.add((kind, name))
        return name

    def _log_params(self) -> None:
        effective = tracking.effective_params(self.params, self.recipe)
        tags = {"recipe.effective_hash": self.recipe.hash, "recipe.sweep_hash": self.recipe.sweep_hash,
                "recipe.sweep": resume.identity(self.recipe, commit=None)["recipe.sweep"]}
        if self.owns_run:
            tags["lab.journal"] = str(self.journal)
        # journaled first, so `labkit sync` can replay them into a store that was away
        self._journal({"type": "params", "effective": effective, "tags": tags})

        def log():  # the effective values, plain strings, in one batch (tracking.effective_params)
            tracking.log_params(self.client, self.run_id, effective)
            tracking.set_tags(self.client, self.run_id, tags)

        self._mlflow(log)

    def _artifact(self, folder: str, files: dict) -> None:
        local = self.journal.parent / "artifacts" / self.id.run / folder
        local.mkdir(parents=True, exist_ok=True)
        for fname, content in files.items():
            p = local / fname
            p.write_bytes(content) if isinstance(content, bytes) else p.write_text(content)
        self._mlflow(lambda: self.client.log_artifacts(self.run_id, str(local), folder))

    def _journal(self, rec: dict) -> None:
        with open(self.journal, "a") as f:
            f.write(json.dumps({"run": self.id.run, **rec}, default=str) + "\n")

    def _mlflow(self, fn) -> None:
        """Log to MLflow; on failure keep going (the journal has it; ``labkit sync`` replays it)
        and say so once. While the store is away, records go to the journal only, and a quick
        probe every OFFLINE_PROBE_S seconds finds it again (MLflow's own retries would stall
        every call of a long run)."""
        if self._offline_since is not None:
            if time.monotonic() - self._offline_since < OFFLINE_PROBE_S:
                return
            if tracking.probe(self.client, retries=0, timeout=5) is not None:
                self._offline_since = time.monotonic()
                return
            self._offline_since = None
            print("labkit.lab: MLflow answers again; `labkit sync` fills in what it missed", file=sys.stderr)
        try:
            fn()
        except Exception as e:
            self._offline_since = time.monotonic()
            if self._mlflow_error is None:
                print(f"labkit.lab: MLflow logging failed ({type(e).__name__}: {e}); "
                      f"records continue in {self.journal}", file=sys.stderr)
            self._mlflow_error = f"{type(e).__name__}: {e}"
            self._journal({"type": "mlflow_error", "error": self._mlflow_error,
                           "trace": traceback.format_exc(limit=3)})

    def finish(self, status: str | None = None) -> None:
        """Close an interactive run now: ``status``, else FINISHED or, while a cell that
        raised has not run again without error, FAILED."""
        self.close(status, why="finish() was called")

    def close(self, status: str | None = None, *, why: str) -> str | None:
        """Close the run this session created (a papermill run is closed by ``reproduce``)."""
        if not self.owns_run or self.status != "RUNNING":
            return None
        status = status or ("FAILED" if self._failed else "FINISHED")
        self.status = status
        self._journal({"type": "run", "status": status, "why": why, "failed_cells": self._failed})
        self._journal({"type": "close", "status": status})  # what `labkit sync` replays
        produced = [{"type": kind, "name": s["name"]} for kind in ("figure", "table")
                    for s in self._all_specs(kind)]

        def log():
            tracking.set_tags(self.client, self.run_id, {"lab.status": status, "lab.closed_by": why})
            self.client.set_tag(self.run_id, "mlflow.note.content", run_page.note(
                lab_id=str(self.id), notebook=self.notebook, recipe=self.recipe, metrics=self._found,
                produced=produced, status=status))
            self.client.set_terminated(self.run_id, status)

        self._mlflow(log)
        failed = f" (cells that raised and were not re-run: {len(self._failed)})" if self._failed else ""
        print(f"labkit: run {self.id.cite} closed {status}: {why}{failed}")
        return status

    def _reopen(self) -> None:
        was, self.status = self.status, "RUNNING"
        self._journal({"type": "run", "status": "RUNNING", "why": f"a cell ran after the run closed {was}"})
        self._mlflow(lambda: self.client.update_run(self.run_id, status="RUNNING"))
        print(f"labkit: run {self.id.cite} continues (was {was}); it closes again when the last cell runs "
              "or the kernel shuts down")

    def _all_specs(self, kind: str) -> list[dict]:
        out = []
        if self.journal.exists():
            for line in self.journal.read_text().splitlines():
                r = json.loads(line)
                if r.get("type") == kind and r.get("run") == self.id.run:
                    out.append(r)
        return out

    def _at_exit(self) -> None:  # kernel shutdown or restart
        self.close(why="the kernel shut down")


def start(namespace: dict | None = None, *, notebook: str | None = None) -> Lab:
    """Begin (or resume under papermill) the provenance session of this notebook run."""
    global _SESSION
    freeze_at_exit()  # the kernel's exit, which a reproduction waits for, without the last full collection
    ip = _ipython()
    # input_hist_raw[0] is a placeholder and its last entry is the cell running start() now
    history = list(ip.history_manager.input_hist_raw[1:-1]) if ip is not None else []
    names = [n for src in history for n in _assigned_names(src)]
    ns = namespace or {}
    params = {n: ns[n] for n in dict.fromkeys(names) if n in ns and _jsonable(ns[n])}
    where = nbinfo.locate(ns, notebook)
    recipe = effective_recipe(params)
    interactive = not os.environ.get("LABKIT_RUN_ID")
    c = tracking.client(check=interactive)
    source = upstream.choose(c, notebook=where.name, recipe=recipe, interactive=interactive)
    if source is not None and source.lab_id and not recipe.sweep:  # the run to read, recorded as `sweep`
        recipe = resolve(recipe, {"sweep": source.lab_id}, origin=f"{upstream.__name__}: {source.why}")
    previous = None
    if _SESSION is not None:
        if ip is not None:
            ip.events.unregister("pre_run_cell", _SESSION._pre)
            ip.events.unregister("post_run_cell", _SESSION._post)
        atexit.unregister(_SESSION._at_exit)
        closed = _SESSION.close(why="start() ran again in this kernel: a new run begins")
        previous = f"previous run `{_SESSION.id.cite}` closed {closed}" if closed else None
    lab = Lab(notebook=where.name, recipe=recipe, params=params, run_id=os.environ.get("LABKIT_RUN_ID"),
              lab_run=os.environ.get("LABKIT_LAB_RUN"), where=where)
    for src in history:  # the cells before start(): parameters (and papermill's injected ones)
        lab._log_cell(src, status="ok", duration=None, note="ran before labkit.lab.start: duration not measured")
    if ip is not None:
        ip.events.register("pre_run_cell", lab._pre)
        ip.events.register("post_run_cell", lab._post)
        lab._pre()  # this very cell (the start cell) is timed from here
    _SESSION = lab
    lines = [f"labkit run `{lab.id.cite}` · notebook `{where.name}` ({where.origin}) · recipe `{recipe.name}` "
             f"(hash `{recipe.hash}`) · MLflow `{tracking.redact(tracking.tracking_uri())}`"]
    if source is not None:  # first: which upstream run this notebook reads, why, and how to pick another
        lines.insert(0, source.line(lab.client, recipe))
        lab._mlflow(lambda: lab.client.set_tag(lab.run_id, "lab.source_rule", source.why[:5000]))
    if lab.owns_run:
        atexit.register(lab._at_exit)
        ends = "its last code cell runs" if where.code_cells else "you call `lab.finish()`"
        lines.append(f"The run closes when {ends} or the kernel shuts down; `start()` again begins a new run."
                     + (f" ({previous}.)" if previous else ""))
    _display_md("  \n".join(lines))
    return lab


def current() -> Lab:
    if _SESSION is None:
        raise LabkitError("no labkit session in this kernel", "run `lab = labkit.lab.start(globals())` first")
    return _SESSION


