"""``labkit server build|info``: llama.cpp's own llama-server, from the one llama.cpp build.

build: ``make setup`` already built llama.cpp once for this machine (the libraries the
       Python engine loads and the tools: llama-server, llama-bench, llama-batched-bench,
       llama-lookup; ~/.cache/labkit/llama.cpp-<version>-<key>/, with a build.json naming
       the commit, flags and every file's sha256). Then this is a no-op (``cached: true``);
       it builds only what is missing, and --force starts the build over.
info:  the cached build for this machine, or how to make it (exit 1 if there is none).
"""

from __future__ import annotations

import argparse

from labkit.artifacts import server_build
from labkit.commands import add_json_flag, output, progress
from labkit.errors import LabkitError


def setup_arg_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="labkit server", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="what", required=True)
    b = add_json_flag(sub.add_parser("build", help="build (or find cached) llama-server for this machine"))
    b.add_argument("--force", action="store_true", help="rebuild even if a cached build exists")
    b.add_argument("--jobs", type=int, default=None, help="parallel compile jobs (default: every core)")
    add_json_flag(sub.add_parser("info", help="the cached build, if any"))
    return p


def main(argv=None) -> int:
    args = setup_arg_parser().parse_args(argv)
    if args.what == "build":
        if args.jobs is not None and args.jobs < 1:
            raise LabkitError(f"--jobs {args.jobs}", "use --jobs >= 1")
        info = server_build.build(force=args.force, jobs=args.jobs, progress=progress)
        output(args, [_line(info)], info)
        return 0
    info = server_build.find()
    if info is None:
        output(args, [f"no llama-server build for this machine in {server_build.build_dir()}: "
                      "`labkit server build` makes one"], {"built": False, "dir": str(server_build.build_dir())})
        return 1
    output(args, [_line(info)], {"built": True, **info})
    return 0


def _line(info: dict) -> str:
    how = "cached" if info.get("cached") else "built"
    return f"llama-server {how}: {info.get('path')} (llama.cpp {info.get('commit') or info.get('llama_cpp_commit') or '?'})"
