"""``labkit ui``: start the MLflow UI on loopback over labkit's tracking store.

The server is MLflow's own (``mlflow ui``) with labkit's app (provenance/ui_app.py), so a
fresh browser opens every experiment on its runs table, in "Model training" mode, with
the assistant panel closed. ``mlflow ui`` runs uvicorn and its workers as children: they
run in a process group of their own, and SIGTERM, SIGINT or SIGHUP to ``labkit ui`` (a
service manager stopping it, Ctrl-C, a closed terminal) stops that whole group, so no
server is left holding the port.
"""

from __future__ import annotations

import argparse
import importlib.metadata
import os
import signal
import subprocess
import sys
import time

from labkit.provenance import tracking
from labkit.provenance.ui_app import APP_NAME

NO_JSON = "it serves the MLflow UI until stopped; its URL is on stderr"  # `labkit ui --json` says so
STOP_S = 20.0  # how long the server group has to exit on SIGTERM before it is killed


def setup_arg_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="labkit ui", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--port", type=int, default=5000)
    return p


def _app_registered() -> bool:
    return any(ep.name == APP_NAME for ep in importlib.metadata.entry_points(group="mlflow.app"))


def _signal_group(pid: int, sig: int) -> None:
    try:
        os.killpg(pid, sig)
    except ProcessLookupError:
        pass


def _stop_group(proc: subprocess.Popen, timeout: float = STOP_S) -> None:
    """SIGTERM to the server's process group, SIGKILL to what is left after ``timeout``."""
    _signal_group(proc.pid, signal.SIGTERM)
    try:
        proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        pass
    # the leader has exited (or is stuck): any worker it did not reap is ended too
    _signal_group(proc.pid, signal.SIGKILL)
    proc.wait(timeout=10)


def main(argv=None) -> int:
    args = setup_arg_parser().parse_args(argv)
    uri = tracking.tracking_uri()
    if uri.startswith("http"):
        print(f"MLFLOW_TRACKING_URI points at a server ({uri}); open it in a browser", file=sys.stderr)
        return 0
    tracking.mark_experiment_kinds(tracking.client())  # a store from before the tag: marked too
    cmd = [sys.executable, "-m", "mlflow", "ui", "--host", "127.0.0.1", "--port", str(args.port),
           "--backend-store-uri", uri]
    if _app_registered():
        cmd += ["--app-name", APP_NAME]
    else:  # a venv installed before the entry point: plain MLflow (GenAI view in a fresh browser)
        print("labkit ui: the 'labkit' MLflow app is not registered in this environment (run `make setup`); "
              "serving MLflow's plain UI: use the link below, or switch the sidebar to 'Model training'",
              file=sys.stderr)
    print(f"MLflow UI on http://127.0.0.1:{args.port}/#/experiments?workflowType=machine_learning "
          f"(store {uri}); Ctrl-C stops it", file=sys.stderr)
    proc = subprocess.Popen(cmd, start_new_session=True)
    stopping: list[int] = []

    def on_signal(signum, _frame):  # only note it: the loop below does the waiting
        stopping.append(signum)

    old = {s: signal.signal(s, on_signal) for s in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)}
    try:
        while proc.poll() is None and not stopping:
            time.sleep(0.2)
    finally:
        for s, h in old.items():
            signal.signal(s, h)
        _stop_group(proc, timeout=STOP_S if stopping else 5.0)
    if stopping:
        print(f"labkit ui: stopped ({signal.Signals(stopping[0]).name}); its server processes with it",
              file=sys.stderr)
        return 0
    return proc.returncode
