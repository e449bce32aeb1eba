"""Benchmark: what the team server's password check costs a client, with the auth cache off and on.

MLflow's basic-auth app stores passwords as scrypt hashes; without its credential cache
(``auth_cache_ttl_seconds``, 0 by default) every request pays a scrypt check. labkit's
``scripts/team-server.sh`` turns the cache on (``LABKIT_TEAM_AUTH_CACHE_S``, default 60).
This starts a real team server (PostgreSQL + ``mlflow server --app-name basic-auth`` on
127.0.0.1, no TLS) in a temporary folder, adds an editor, and per round, the two arms in a
fresh random order: starts the server with the cache off (0) or on (60), times ``--requests``
authenticated requests (``search_experiments``, one HTTP request each) and, in the first
``--reproduce-rounds`` rounds, a tiny ``labkit reproduce --only 01_cost_fit`` logged to it;
then stops it. The ratio on/off is paired by round (labkit.analysis.decide). The server is
always stopped and its folder removed.

    python benchmarks/bench_team_auth.py [--rounds 4] [--requests 60] [--reproduce-rounds 1]

Needs PostgreSQL (scripts/system-deps.sh). Prints JSON as its last line.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
from bench_verify_kernels import (
    _ratio,  # one paired-by-round ratio with its interval, for both benchmarks
)

from labkit.measure.serve import free_port

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "scripts" / "team-server.sh"
ARMS = {"off": "0", "on": "60"}
# a tiny 01 (tests/tiny.py's FAST_01, no cost models): seconds of compute, every kind of request
TINY = {"verify_rounds": 3, "verify_m": [1, 2, 3], "kv_depth": 32, "crosscheck_rounds": 2, "op_profile_rounds": 0,
        "cost_models": []}
CREDS = ("MLFLOW_TRACKING_USERNAME", "MLFLOW_TRACKING_PASSWORD", "NETRC", "MLFLOW_TRACKING_URI")


def _run(args: list[str], env: dict, timeout: int = 600) -> subprocess.CompletedProcess:
    r = subprocess.run(args, env=env, capture_output=True, text=True, timeout=timeout, cwd=ROOT)
    if r.returncode != 0:
        raise SystemExit(f"error: {' '.join(args[:4])} exited {r.returncode}\n{r.stderr[-3000:]}")
    return r


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rounds", type=int, default=4)
    ap.add_argument("--requests", type=int, default=60)
    ap.add_argument("--reproduce-rounds", type=int, default=1)
    a = ap.parse_args(argv)
    if a.rounds < 2 or a.requests < 1:
        raise SystemExit("error: --rounds must be 2 or more and --requests 1 or more\nfix: e.g. --rounds 4 --requests 60")
    if shutil.which("initdb") is None and not list(Path("/usr/lib/postgresql").glob("*/bin/initdb")):
        raise SystemExit("error: PostgreSQL is not installed\nfix: scripts/system-deps.sh (or apt-get install postgresql)")
    d = Path(tempfile.mkdtemp(prefix="lkbench.", dir="/tmp"))  # short: the socket path is bounded
    d.chmod(0o755)  # the postgres user walks into it
    port = free_port()
    base = {k: v for k, v in os.environ.items() if k not in CREDS}
    mlflow = str(Path(sys.executable).with_name("mlflow"))
    server_env = {**base, "LABKIT_TEAM_DIR": str(d), "LABKIT_TEAM_PORT": str(port), "LABKIT_TEAM_AUTH": "1",
                  "LABKIT_TEAM_TLS": "0", "LABKIT_MLFLOW": mlflow, "LABKIT_TEAM_WAIT": "240",
                  "PYTHONPATH": str(ROOT / "src")}
    url = f"http://127.0.0.1:{port}"
    samples: dict[str, dict[str, list[float]]] = {arm: {"request_ms": [], "reproduce_s": []} for arm in ARMS}
    rng = np.random.default_rng(0)
    try:
        _run([str(SCRIPT), "start"], {**server_env, "LABKIT_TEAM_AUTH_CACHE_S": "0"})
        r = _run([sys.executable, "-m", "labkit.cli", "team", "user", "add", "bench", "--role", "editor", "--json"],
                 server_env)
        netrc = json.loads(r.stdout.strip().splitlines()[-1])["credentials"]  # the netrc file it wrote
        words = Path(netrc).read_text().split()
        user, pw = words[words.index("login") + 1], words[words.index("password") + 1]
        _run([str(SCRIPT), "stop"], server_env)
        client_env = {**base, "MLFLOW_TRACKING_URI": url, "MLFLOW_TRACKING_USERNAME": user,
                      "MLFLOW_TRACKING_PASSWORD": pw, "PYTHONPATH": str(ROOT / "src"), "LABKIT_ROOT": str(ROOT)}
        os.environ.update({k: client_env[k] for k in ("MLFLOW_TRACKING_URI", "MLFLOW_TRACKING_USERNAME",
                                                      "MLFLOW_TRACKING_PASSWORD")})
        from mlflow.tracking import MlflowClient

        for rnd in range(a.rounds):
            for arm in rng.permutation(list(ARMS)):
                _run([str(SCRIPT), "start"], {**server_env, "LABKIT_TEAM_AUTH_CACHE_S": ARMS[arm]})
                try:
                    c = MlflowClient(tracking_uri=url)
                    c.search_experiments()  # warm: the worker's first check, the connection
                    t0 = time.perf_counter()
                    for _ in range(a.requests):
                        c.search_experiments()
                    samples[arm]["request_ms"].append((time.perf_counter() - t0) / a.requests * 1e3)
                    if rnd < a.reproduce_rounds:
                        args = [w for k, v in TINY.items() for w in ("-p", f"{k}={json.dumps(v)}")]
                        t0 = time.perf_counter()
                        _run([sys.executable, "-m", "labkit.cli", "reproduce", "--only", "01_cost_fit", *args, "--json",
                              "--out", str(d / f"run-{arm}-{rnd}")], client_env, timeout=1200)
                        samples[arm]["reproduce_s"].append(time.perf_counter() - t0)
                finally:
                    _run([str(SCRIPT), "stop"], server_env)
            print(f"round {rnd + 1}/{a.rounds}: " + ", ".join(
                f"{arm} {samples[arm]['request_ms'][-1]:.1f} ms/request" for arm in ARMS), file=sys.stderr, flush=True)
    finally:
        subprocess.run([str(SCRIPT), "stop"], env=server_env, capture_output=True, timeout=180)
        shutil.rmtree(d, ignore_errors=True)
    out = {"kind": "team_auth", "rounds": a.rounds, "requests": a.requests, "workers": 2, "tls": False,
           "order": "the two arms in a fresh random order each round, the server restarted for each",
           "request_ms": {arm: round(float(np.median(s["request_ms"])), 1) for arm, s in samples.items()},
           "request_on_over_off": _ratio(samples["on"]["request_ms"], samples["off"]["request_ms"]),
           "reproduce_s": {arm: [round(x, 1) for x in s["reproduce_s"]] for arm, s in samples.items()}}
    print(f"one authenticated request: {out['request_ms']['off']} ms with the cache off, {out['request_ms']['on']} ms "
          f"on ({out['request_on_over_off']['text']}); a tiny 01 reproduction: off {out['reproduce_s']['off']} s, "
          f"on {out['reproduce_s']['on']} s", file=sys.stderr)
    print(json.dumps(out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
