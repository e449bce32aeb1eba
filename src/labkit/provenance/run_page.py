"""What a run's page in the MLflow UI shows beyond the raw records.

The records (cells, tables, figures, metrics) are what labkit reads back; this module
fills the fields the UI itself displays: the run's description (``mlflow.note.content``:
its LAB ID, recipe and what it found), the executed notebook as HTML (readable in the
artifact viewer, where an ``.ipynb`` is only JSON), and system metrics (CPU, memory,
disk, network; GPU where mlflow finds one) sampled while a reproduction runs.
"""

from __future__ import annotations

import logging
import sys
from pathlib import Path

from labkit.provenance.metric_keys import canonical_metrics
from labkit.provenance.tracking import set_tags, tracking_uri

NOTE_METRICS = 24  # the note lists this many metrics; the run's Metrics table has all of them
SYSTEM_METRICS_INTERVAL_S = 5.0  # psutil sampling is cheap; 5 s gives a short notebook a few points


def note(*, lab_id: str, notebook: str, recipe, metrics: dict, produced: list[dict], status: str) -> str:
    """The run description: what ran, with which recipe, and what it found (Markdown)."""
    lines = [f"**[{lab_id}]** · notebook `{notebook}` · recipe `{recipe.name}` (hash `{recipe.hash}`) · {status}"]
    found = {k: v for k, v in canonical_metrics(metrics).items()
             if not k.endswith((".lo", ".hi")) and not k.startswith(("lab/", "system/"))}
    if found:
        lines += ["", "Found:"]
        for k in sorted(found)[:NOTE_METRICS]:
            lo, hi = metrics.get(f"{k}.lo"), metrics.get(f"{k}.hi")
            lines.append(f"- `{k}` = {found[k]:.4g}" + (f" (range {lo:.4g}–{hi:.4g})" if lo is not None and hi is not None
                                                        else ""))
        if len(found) > NOTE_METRICS:
            lines.append(f"- … and {len(found) - NOTE_METRICS} more in Metrics")
    for kind in ("figure", "table"):
        names = [p["name"] for p in produced if p.get("type") == kind]
        if names:
            lines += ["", f"{kind.capitalize()}s: " + ", ".join(f"`{n}`" for n in names)]
    return "\n".join(lines)


def write_note(c, run_id: str, *, lab_id: str, notebook: str, recipe, produced: list[dict], status: str) -> str:
    """Set the run's description from what it logged (metrics are read back from the store)."""
    metrics = c.get_run(run_id).data.metrics
    text = note(lab_id=lab_id, notebook=notebook, recipe=recipe, metrics=metrics, produced=produced, status=status)
    set_tags(c, run_id, {"mlflow.note.content": text})
    return text


def log_notebook_html(c, run_id: str, executed: Path) -> str | None:
    """Log the executed notebook as ``notebook/<name>.html`` (nbconvert's lab template,
    images inline); None, with a line on stderr, when it cannot be converted."""
    try:
        from nbconvert import HTMLExporter

        body, _ = HTMLExporter().from_filename(str(executed))
    except Exception as e:  # a notebook that cannot be rendered must not cost the run its records
        print(f"labkit: {executed.name} not rendered as HTML ({type(e).__name__}: {e})", file=sys.stderr)
        return None
    path = f"notebook/{executed.stem}.html"
    c.log_text(run_id, body, path)
    return path


def start_system_metrics(run_id: str, *, interval: float = SYSTEM_METRICS_INTERVAL_S):
    """Sample system metrics into ``run_id`` (keys ``system/…``) until ``stop_system_metrics``
    or until the run is no longer RUNNING. None when psutil (or mlflow's monitor) is missing.
    The monitor's INFO lines (started, stopping, no GPU) are not printed: four a notebook in
    the terminal that say nothing of the run; its warnings still are."""
    logging.getLogger("mlflow.system_metrics").setLevel(logging.WARNING)
    try:
        from mlflow.system_metrics.system_metrics_monitor import SystemMetricsMonitor

        monitor = SystemMetricsMonitor(run_id, sampling_interval=interval, tracking_uri=tracking_uri())
    except Exception as e:  # psutil missing: the run goes on without system metrics, and says so
        print(f"labkit: no system metrics ({type(e).__name__}: {e})", file=sys.stderr)
        return None
    monitor.start()
    return monitor


def stop_system_metrics(monitor) -> None:
    if monitor is not None:
        monitor.finish()
