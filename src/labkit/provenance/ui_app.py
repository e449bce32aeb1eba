"""MLflow's own server app, with the UI opening on runs: what ``labkit ui`` serves.

Why this exists: MLflow 3.17.2's UI ignores the experiment tag ``mlflow.experimentKind``
(its ``useExperimentKind`` hook returns the kind derived from the *workflow type* whenever
the workflow-type switch is enabled, and in this build it always is). The workflow type
comes from the URL's ``?workflowType=`` when present, else from the browser's
localStorage key ``mlflow.workflowType_v1``, else ``"genai"``. So a fresh browser that
clicks an experiment in the list (a link without the URL parameter) lands on the GenAI
"Overview", and run pages sit under "Evaluations". Likewise, on a server reached as
localhost the "MLflow Assistant" panel opens itself once per browser unless
``mlflow.assistant.fab.autoOpenedOnFirstLoad_v1`` is already set.

There is no server-side setting for either. This module wraps MLflow's ASGI app
(``mlflow.server.fastapi_app.app``, unchanged) and serves its ``index.html`` with a
small script in ``<head>`` that runs before MLflow's bundle and sets those two
localStorage keys *when they are absent*: a fresh browser opens labkit's experiments
on their runs table ("Model training") with the assistant closed, and a user who flips
the sidebar switch to GenAI keeps that choice (MLflow writes the key, we never
overwrite it).

Registered as the ``mlflow.app`` entry point ``labkit`` (pyproject.toml), so
``mlflow ui --app-name labkit`` runs MLflow's own server command (store checks,
uvicorn, workers, signal handling) with this app.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

APP_NAME = "labkit"  # the entry point name: `mlflow ui --app-name labkit`

# localStorage key -> value, as MLflow's useLocalStorage writes them (`<key>_v<version>`, JSON)
UI_DEFAULTS = {
    "mlflow.workflowType_v1": json.dumps("machine_learning"),
    "mlflow.assistant.fab.autoOpenedOnFirstLoad_v1": json.dumps(True),
}

SCRIPT = ("<script>/* labkit ui: open on runs, assistant closed (labkit/provenance/ui_app.py) */"
          "(function(){var d=" + json.dumps(UI_DEFAULTS) + ";try{for(var k in d)"
          "{if(window.localStorage.getItem(k)===null)window.localStorage.setItem(k,d[k]);}}catch(e){}})();"
          "</script>")


def index_html(static_folder: str | os.PathLike) -> bytes:
    """MLflow's ``index.html`` with the defaults script first in ``<head>``."""
    html = Path(static_folder, "index.html").read_text()
    i = html.find("<head>")
    assert i >= 0, "MLflow's index.html has no <head>"
    i += len("<head>")
    return (html[:i] + SCRIPT + html[i:]).encode()


class UiDefaults:
    """ASGI middleware: GET of the UI's page (``/`` or ``/index.html`` under MLflow's static
    prefix) answers with :func:`index_html`; everything else goes to MLflow's app."""

    def __init__(self, app, *, static_folder: str, prefix: str = ""):
        self.app = app
        self.pages = {prefix.rstrip("/") + "/", prefix.rstrip("/") + "/index.html"}
        self.body = index_html(static_folder)

    async def __call__(self, scope, receive, send):
        if scope["type"] == "http" and scope.get("method") in ("GET", "HEAD") and scope.get("path") in self.pages:
            await send({"type": "http.response.start", "status": 200,
                        "headers": [(b"content-type", b"text/html; charset=utf-8"),
                                    (b"content-length", str(len(self.body)).encode()),
                                    (b"cache-control", b"no-cache")]})
            await send({"type": "http.response.body", "body": b"" if scope["method"] == "HEAD" else self.body})
            return
        await self.app(scope, receive, send)


def create_app():
    """The app uvicorn serves (a factory: importing this module stays cheap for MLflow's launcher)."""
    from mlflow.server import app as flask_app
    from mlflow.server.fastapi_app import app
    from mlflow.server.handlers import STATIC_PREFIX_ENV_VAR

    return UiDefaults(app, static_folder=flask_app.static_folder, prefix=os.environ.get(STATIC_PREFIX_ENV_VAR, ""))
