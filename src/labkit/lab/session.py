"""The notebook side of provenance: one MLflow run per notebook run, every cell logged.

A notebook's second cell is ``lab = labkit.lab.start(globals())``. From then on an
IPython ``post_run_cell`` hook logs each executed cell (index, source hash, duration,
status, and the metrics, tables and figures it produced) under its ``[LAB: …]`` ID.
Cells that ran before ``start`` (the parameters) are logged from the kernel's history.

Under ``labkit reproduce`` the run already exists (``LABKIT_RUN_ID``); interactively,
``start`` creates it. Each record goes first to a local journal (JSON lines) and then
to MLflow, so a tracking store that fails mid-run loses nothing already measured.
"""

from __future__ import annotations

import hashlib
import json
import os
import sys
import tempfile
import time
import traceback
from pathlib import Path

from labkit.config.recipe import Recipe, effective_recipe
from labkit.errors import LabkitError
from labkit.lab.ipython import _assigned_names, _display, _display_md, _ipython, _jsonable
from labkit.paths import project_root
from labkit.provenance import fingerprint, frames, ids, runtags, tracking
from labkit.report import figures

_SESSION: Lab | None = None




def _sha(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()[:12]




class Lab:
    """The provenance session of one notebook run."""

    def __init__(self, *, notebook: str, recipe: Recipe, params: dict, run_id: str | None = None,
                 lab_run: str | None = None):
        self.notebook = notebook
        self.recipe = recipe
        self.params = params
        self.client = tracking.client()
        self.owns_run = run_id is None
        if self.owns_run:
            prov = fingerprint.collect(recipe=recipe)
            tags = {**runtags.flat_tags(prov), "papermill.parameters": json.dumps(params, default=str),
                    "lab.mode": "interactive", "lab.notebook": notebook}
            self.run_id, self.id = tracking.new_run(self.client, notebook=notebook, recipe=recipe, tags=tags)
            tracking.log_json(self.client, self.run_id, prov, "fingerprint.json")
        else:
            self.run_id, self.id = run_id, ids.LabId(lab_run)
        journal = os.environ.get("LABKIT_JOURNAL")
        self.journal = Path(journal) if journal else project_root() / "lab" / "journal" / f"{self.id.run}.jsonl"
        self.journal.parent.mkdir(parents=True, exist_ok=True)
        self.n_cells = 0
        self._t0: float | None = None
        self._produced: dict = {}
        self._names: set[str] = set()
        self._mlflow_error: str | None = None
        self._log_params()

    # -- what notebooks call -----------------------------------------------------------
    def cite(self, part: str | None = None) -> str:
        return (self.id.child(part) if part else self.id).cite

    def engine(self, *, draft: bool = False, load_mtp: bool = False, **kw):
        """Open the recipe's engine and tag the run with its build, flags and model
        (``kw``: ``n_seq_max``, ``n_ctx`` per sequence, for the multi-slot loop)."""
        from labkit.config.runtime import open_engine

        e = open_engine(self.recipe, draft=draft, load_mtp=load_mtp, **kw)
        desc = e.describe()
        prefix = "draft." if draft else ""
        self._mlflow(lambda: [self.client.set_tag(self.run_id, prefix + k, str(v)[:5000])
                              for k, v in runtags.engine_tags(desc).items()])
        self._mlflow(lambda: tracking.log_json(self.client, self.run_id, desc, f"{prefix}engine.json"))
        return e

    def metric(self, name: str, value: float, *, lo: float | None = None, hi: float | None = None,
               step: int | None = None) -> float:
        """Log a metric, with its recorded range (lo, hi) when it has one."""
        entry = {"name": name, "value": float(value), "lo": lo, "hi": hi, "step": step}
        self._produced.setdefault("metrics", []).append(entry)
        self._journal({"type": "metric", **entry})

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
        lab_id = str(self.id.child(self._unique(name)))
        text = frames.frame_to_json(df)
        spec = {"type": "table", "name": name, "id": lab_id, "cell": self.n_cells + 1,
                "data_sha256": frames.digest(text), "noise": noise or {}}
        self._artifact(f"tables/{name}", {"data.json": text, "table.csv": df.to_csv(index=False),
                                          "spec.json": json.dumps(spec, indent=1)})
        self._produced.setdefault("tables", []).append(spec)
        self._journal({"type": "table", **spec})
        if display:
            _display_md(f"`[{lab_id}]`")
            _display(df)
        return df

    def figure(self, kind: str, data, *, name: str, noise: dict | None = None, display: bool = True, **kw):
        """Draw a registered figure from ``data``, stamp it, log PNG/SVG + data + spec, show it."""
        import matplotlib.pyplot as plt

        lab_id = str(self.id.child(self._unique(name)))
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

    # -- cell hooks ----------------------------------------------------------------------
    def _pre(self, info=None) -> None:
        self._t0 = time.perf_counter()
        self._produced = {}

    def _post(self, result) -> None:
        source = result.info.raw_cell if getattr(result, "info", None) is not None else ""
        err = result.error_in_exec or result.error_before_exec
        status = "ok" if err is None else "error"
        duration = time.perf_counter() - self._t0 if self._t0 is not None else None
        self._log_cell(source, status=status, duration=duration,
                       error=None if err is None else f"{type(err).__name__}: {err}")
        self._t0 = None

    def _log_cell(self, source: str, *, status: str, duration: float | None, error: str | None = None,
                  note: str | None = None) -> None:
        self.n_cells += 1
        idx = self.n_cells
        rec = {
            "type": "cell", "index": idx, "id": str(self.id.child(f"c{idx}")), "source_sha256": _sha(source),
            "source": source, "duration_s": duration, "status": status, "error": error, "note": note,
            "produced": self._produced, "time": time.strftime("%Y-%m-%dT%H:%M:%S"),
        }
        self._journal(rec)

        def log():
            tracking.log_json(self.client, self.run_id, rec, f"cells/c{idx:03d}.json")
            if duration is not None:
                self.client.log_metric(self.run_id, "lab.cell_duration_s", duration, step=idx)
            self.client.set_tag(self.run_id, "lab.cells", str(idx))

        self._mlflow(log)
        self._produced = {}

    # -- plumbing ------------------------------------------------------------------------
    def _unique(self, name: str) -> str:
        if name in self._names:
            raise LabkitError(f"figure/table name {name!r} is used twice in this notebook", "give each a distinct name")
        if name.startswith("c") and name[1:].isdigit():
            raise LabkitError(f"name {name!r} looks like a cell ID", "choose a descriptive name such as 'cost-fit'")
        self._names.add(name)
        return name

    def _log_params(self) -> None:
        def log():
            for k, v in self.params.items():
                self.client.log_param(self.run_id, k, json.dumps(v, default=str)[:6000])
            for k, v in self.recipe.to_dict().items():
                if k not in self.params:
                    self.client.log_param(self.run_id, f"recipe.{k}", json.dumps(v, default=str)[:6000])
            self.client.set_tag(self.run_id, "recipe.effective_hash", self.recipe.hash)
            self.client.set_tag(self.run_id, "recipe.sweep_hash", self.recipe.sweep_hash)

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
        """Log to MLflow; on failure keep going (the journal has it) and say so once."""
        try:
            fn()
        except Exception as e:
            if self._mlflow_error is None:
                print(f"labkit.lab: MLflow logging failed ({type(e).__name__}: {e}); "
                      f"records continue in {self.journal}", file=sys.stderr)
            self._mlflow_error = f"{type(e).__name__}: {e}"
            self._journal({"type": "mlflow_error", "error": self._mlflow_error,
                           "trace": traceback.format_exc(limit=3)})

    def finish(self, status: str = "FINISHED") -> None:
        if self.owns_run:
            self._mlflow(lambda: self.client.set_terminated(self.run_id, status))






def start(namespace: dict | None = None, *, notebook: str | None = None) -> Lab:
    """Begin (or resume under papermill) the provenance session of this notebook run."""
    global _SESSION
    ip = _ipython()
    # input_hist_raw[0] is a placeholder and its last entry is the cell running start() now
    history = list(ip.history_manager.input_hist_raw[1:-1]) if ip is not None else []
    names = [n for src in history for n in _assigned_names(src)]
    ns = namespace or {}
    params = {n: ns[n] for n in dict.fromkeys(names) if n in ns and _jsonable(ns[n])}
    notebook = notebook or os.environ.get("LABKIT_NOTEBOOK") or ns.get("__vsc_ipynb_file__") or "00_interactive"
    notebook = Path(notebook).stem
    recipe = effective_recipe(params)
    if _SESSION is not None and ip is not None:
        ip.events.unregister("pre_run_cell", _SESSION._pre)
        ip.events.unregister("post_run_cell", _SESSION._post)
    lab = Lab(notebook=notebook, recipe=recipe, params=params, run_id=os.environ.get("LABKIT_RUN_ID"),
              lab_run=os.environ.get("LABKIT_LAB_RUN"))
    for src in history:  # the cells before start(): parameters (and papermill's injected ones)
        lab._log_cell(src, status="ok", duration=None, note="ran before labkit.lab.start: duration not measured")
    if ip is not None:
        ip.events.register("pre_run_cell", lab._pre)
        ip.events.register("post_run_cell", lab._post)
        lab._pre()  # this very cell (the start cell) is timed from here
    _SESSION = lab
    _display_md(f"labkit run `{lab.id.cite}` · recipe `{recipe.name}` (hash `{recipe.hash}`) · "
                f"MLflow `{tracking.tracking_uri()}`")
    return lab


def current() -> Lab:
    if _SESSION is None:
        raise LabkitError("no labkit session in this kernel", "run `lab = labkit.lab.start(globals())` first")
    return _SESSION






