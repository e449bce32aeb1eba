"""``labkit <command>``: a thin dispatcher; each command is a module with
``setup_arg_parser()`` and ``main(argv)`` (mlx-lm's layout)."""

from __future__ import annotations

import importlib
import os
import sys

from labkit.errors import LabkitError
from labkit.teardown import freeze_at_exit

COMMANDS = {
    "models": "Prepare and list models with sha256",
    "bench": "Measure verify(m) cost or speculative vs plain decoding",
    "reproduce": "Run the notebooks under papermill, logged to MLflow",
    "show": "Print what a [LAB: ...] ID points at",
    "regen": "Regenerate a figure or table from its [LAB: ...] ID",
    "worksheet": "The accounting worksheet, filled from logged runs",
    "export": "A logged table, matrix section or worksheet as csv, md or LaTeX",
    "advise": "Recommended k per workload, from logged measurements",
    "toolsuite": "Tool-calling quality control, speculation on vs off",
    "power": "Energy and CPU time per token, k=0 vs a speculative k",
    "ui": "Start the MLflow UI on loopback",
    "sync": "Replay local journals into the tracking store (after a server outage)",
    "compare": "Hosts, builds or commits side by side for one recipe, with ratios",
    "server": "Build llama.cpp's llama-server from the wheel's sources (cached per machine)",
    "machine": "Measure this host's profile for the planner (bandwidth, overhead, per-row compute)",
    "team": "The team server's users: `labkit team user add NAME --role reader|editor|admin`",
    "plan": "Predict the §E matrix for a model, placement and box; --check it against measurement",
}


def _usage() -> str:
    width = max(map(len, COMMANDS))
    rows = "\n".join(f"  {name:<{width}}  {text}" for name, text in COMMANDS.items())
    return f"usage: labkit <command> [options]\n\ncommands:\n{rows}\n\nlabkit <command> --help for each."


def _report(cmd: str, e: LabkitError) -> int:
    print(f"labkit {cmd}: error: {e.problem}", file=sys.stderr)
    if e.fix:
        print(f"  fix: {e.fix}", file=sys.stderr)
    return 2


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help"):
        print(_usage())
        return 0
    cmd, rest = argv[0], argv[1:]
    freeze_at_exit()  # registered before the command imports MLflow, so it runs after MLflow's handlers
    if cmd not in COMMANDS:
        print(f"labkit: unknown command {cmd!r}\n\n{_usage()}", file=sys.stderr)
        return 2
    module = importlib.import_module(f"labkit.commands.{cmd}")
    try:
        if "--json" in rest and getattr(module, "NO_JSON", None):
            raise LabkitError(f"--json: labkit {cmd} has nothing to print as JSON ({module.NO_JSON})",
                              "run it without --json")
        return int(module.main(rest) or 0)
    except BrokenPipeError:
        return _closed_pipe()
    except LabkitError as e:
        return _report(cmd, e)
    except Exception as e:  # a server's 401/403/bad certificate mid-command: say which variable to fix
        from labkit.provenance.store import auth_error

        refused = auth_error(e)
        if refused is None:
            raise
        return _report(cmd, refused)
    except KeyboardInterrupt:
        print(f"labkit {cmd}: interrupted", file=sys.stderr)
        return 130


def _closed_pipe() -> int:
    """The reader went away (``labkit worksheet | head -3``): nothing more to say, and no
    traceback. stdout is pointed at /dev/null so that the interpreter's own flush at exit
    does not fail again; 141 is what a shell reports for a writer ended by SIGPIPE."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
    except (OSError, ValueError):  # stdout already closed or not a real file (a test's capture)
        pass
    return 141


if __name__ == "__main__":
    sys.exit(main())
