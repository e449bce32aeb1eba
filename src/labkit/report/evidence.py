"""The logged runs a worksheet or a matrix section stands on, gathered once, each with its ID.

Every reader here returns what it found *or* why there is nothing ("no data: …"), never
a silent default: the worksheets print that reason in the field. Nothing measures.

Inputs from other notebooks are read by name and tolerated when absent: the k sweep's
``protocol-steps`` table and ``protocol.winner`` / ``protocol.stopped`` tags (stepwise
protocol), 07's ``concurrency`` and ``concurrency-verdict`` tables, and the engine's
``residency`` record in its old (``layers_on_host``/``layers_on_accelerator``) and new
(``asked``/``placed``/``label``, read from llama.cpp's load log) shapes.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field

import pandas as pd

from labkit.errors import LabkitError
from labkit.provenance import tracking
from labkit.report.queries import NO_DATA, latest_runs, load_table, source_run


def no_data(why: str) -> str:
    return NO_DATA.format(why=why)


def table_or_none(c, run, name: str) -> pd.DataFrame | None:
    try:
        return load_table(c, run, name)
    except LabkitError:
        return None


def json_tag(tags: dict, name: str):
    raw = tags.get(name)
    if not raw:
        return None
    try:
        return json.loads(raw)
    except json.JSONDecodeError:
        return raw


def engine_record(c, run) -> dict:
    """The engine's ``describe()`` as the run logged it (engine.json), or {}."""
    try:
        return tracking.load_json_artifact(c, run.info.run_id, "engine.json")
    except LabkitError:
        return {}


def host_label(tags: dict) -> str:
    """host.label when the run has one, else the host name with its CPU and cores."""
    if tags.get("host.label"):
        return tags["host.label"]
    cpu = tags.get("host.cpu")
    return f"{tags.get('host.name', '?')}" + (f" ({cpu}, {tags.get('host.cores', '?')} cores)" if cpu else "")


def residency_text(res, *, build: dict | None = None) -> str:
    """Where the weights went, in the chapter's terms (everything on the host is maximum spill).

    ``res`` is the engine's residency record, old or new shape; ``build`` its build info
    (says whether the build can offload at all)."""
    if not res:
        return no_data("the engine did not report residency")
    if isinstance(res, str):
        return res
    if "placed" in res or "label" in res:  # read from llama.cpp's load log
        placed = res.get("placed") or {}
        bufs = ", ".join(f"{dev} {mib:.0f} MiB" for dev, mib in (placed.get("buffers_mib") or {}).items())
        parts = [res.get("label") or "placed"]
        if placed.get("layers_total") is not None:
            parts.append(f"{placed.get('layers_offloaded', 0)}/{placed['layers_total']} layers offloaded")
        if bufs:
            parts.append(f"buffers {bufs}")
        asked = {k: v for k, v in (res.get("asked") or {}).items() if v}  # the defaults (0: nothing offloaded) go unsaid
        if asked:
            parts.append("asked " + ", ".join(f"{k}={v}" for k, v in sorted(asked.items())))
        return "; ".join(parts) + " (from the load log)"
    on_acc, on_host = int(res.get("layers_on_accelerator", 0)), int(res.get("layers_on_host", 0))
    total = on_acc + on_host
    if on_acc == 0:
        lead = ("no accelerator in this build: " if build and build.get("gpu_offload_supported") is False else "")
        return f"{lead}all {total} layers on the host (maximum spill); as asked, not read from the load log"
    return f"{on_acc}/{total} layers offloaded, {on_host} on the host; as asked, not read from the load log"


@dataclass
class Sweep:
    """The newest k sweep of a recipe and the tables the worksheets read from it."""

    run: object = None
    id: str | None = None
    why: str | None = None  # why there is no sweep
    cells: pd.DataFrame | None = None
    rows: pd.DataFrame | None = None
    pred: pd.DataFrame | None = None
    steps: pd.DataFrame | None = None  # protocol-steps (stepwise protocol), when logged
    winner: dict | None = None
    stopped: str | None = None
    engine: dict = field(default_factory=dict)

    @property
    def tags(self) -> dict:
        return self.run.data.tags if self.run is not None else {}


def sweep(c, recipe) -> Sweep:
    try:
        run, sid = source_run(c, "02_k_sweep", recipe)
    except LabkitError as e:
        return Sweep(why=f"no 02_k_sweep run ({e.problem.split(' in ')[0]}); run labkit reproduce --only 02_k_sweep")
    s = Sweep(run=run, id=sid, cells=table_or_none(c, run, "sweep-cells"), rows=table_or_none(c, run, "sweep-runs"),
              pred=table_or_none(c, run, "cost-model"), steps=table_or_none(c, run, "protocol-steps"),
              engine=engine_record(c, run))
    w = json_tag(run.data.tags, "protocol.winner")
    s.winner = w if isinstance(w, dict) else None
    s.stopped = run.data.tags.get("protocol.stopped")
    if s.cells is None:
        s.why = f"{sid} logged no sweep-cells table"
    return s


@dataclass
class Newest:
    """The newest finished run of a notebook for a recipe, or why there is none."""

    run: object = None
    id: str | None = None
    why: str | None = None

    @property
    def tags(self) -> dict:
        return self.run.data.tags if self.run is not None else {}

    @property
    def metrics(self) -> dict:
        return self.run.data.metrics if self.run is not None else {}


def newest(c, notebook: str, recipe) -> Newest:
    runs = latest_runs(c, notebook, recipe_name=recipe.name, limit=1)
    if not runs:
        return Newest(why=f"no {notebook} run for recipe {recipe.name}; run labkit reproduce --only {notebook}")
    return Newest(run=runs[0], id=runs[0].data.tags.get("lab.id"))
