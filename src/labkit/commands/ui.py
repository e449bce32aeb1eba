"""``labkit ui``: start the MLflow UI on loopback over labkit's tracking store."""

from __future__ import annotations

import argparse
import subprocess
import sys

from labkit.provenance import tracking


def setup_arg_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="labkit ui", description=__doc__)
    p.add_argument("--port", type=int, default=5000)
    return p


def main(argv=None) -> int:
    args = setup_arg_parser().parse_args(argv)
    uri = tracking.tracking_uri()
    if uri.startswith("http"):
        print(f"MLFLOW_TRACKING_URI points at a server ({uri}); open it in a browser", file=sys.stderr)
        return 0
    tracking.mark_experiment_kinds(tracking.client())  # a store from before the tag: open on runs too
    cmd = [sys.executable, "-m", "mlflow", "ui", "--host", "127.0.0.1", "--port", str(args.port),
           "--backend-store-uri", uri]
    # MLflow 3.x starts a fresh browser in its GenAI view; this link (or the sidebar's "Model
    # training" switch, which the browser remembers) shows labkit's runs
    print(f"MLflow UI on http://127.0.0.1:{args.port}/#/experiments?workflowType=machine_learning "
          f"(store {uri}); Ctrl-C stops it", file=sys.stderr)
    return subprocess.call(cmd)
