"""Benchmark: verify(m)/H for m = 1..8 on one or more llama.cpp builds, interleaved in one run.

Each build is a library folder (``libllama.so`` and its ``libggml*.so``) loaded by its own
worker process through ``LLAMA_CPP_LIB_PATH`` (llama-cpp-python reads it at import, so one
process holds one build). The parent asks the workers for one round at a time, builds in
a fresh random order each round, so that drift on a shared machine hits every build
alike; only one worker computes at a time. A round times ``llama_decode`` of m rows with
every logit row (a speculative verify) at KV depth ``--kv-depth``, every m once in a fresh
order; m = 1 is H, the plain step. Ratios are paired by round and come with their
intervals (labkit.analysis.decide): verify(m)/H per build, and each build over the first.

Each round also times m = 16 and 32, with every logit row and with the last row's only:
``amortised`` is what one more row costs once 16 or more rows share every weight read
((T(32) - T(16)) / 16 per round; ``body_row_ms`` without its logits, ``head_row_ms`` the
output head's part), beside ``small_m_row_ms``, the extra row of a verify ((V(8) - H) / 7 per
round), and their ratio. A small-m row that costs no more than an amortised one pays no
weight read of its own: what is left per row is arithmetic, which batching does not share.

``--profile`` adds, per build, the per-op-class breakdown of one verify for every m
(labkit.measure.op_profile: llama.cpp's cb_eval callback, node by node; a breakdown, not
a timing) after the timed rounds.

    python benchmarks/bench_verify_kernels.py [NAME=]LIBDIR [[NAME=]LIBDIR ...] [--rounds 24] [--profile] [--m-max 12]
    python benchmarks/bench_verify_kernels.py --portable [--rounds 24] [--profile]

With no LIBDIR, the installed build (llama_cpp/lib) alone. ``--portable`` puts first, as the
reference every other build is compared with, the pinned llama.cpp sources without labkit's
patches, built with the installed build's own flags (``portable_libdir``: made once into
``$LABKIT_CACHE/bench/``, a minute or two; the patches touch ggml-cpu only, so only that
library is compiled, the others are the installed build's); with no LIBDIR the installed
build follows as ``labkit``. That is the before/after of issue 44 on a fresh clone. The
reference is named ``portable`` where the installed build has the portable flags, and
``unpatched`` where it has a CPU variant's (``LABKIT_CPU_VARIANT``). ``--model`` names a zoo model:
the embedded one by default, ``synthetic-small-vocab`` for the same body with a 4,096-token
head (SYNTHETIC random weights, cost only). Prints JSON as its last line.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pandas as pd

M_VALUES = tuple(range(1, 9))  # the targets' m; --m-max times more (k = 8 verifies 9 rows)
BIG_M = (16, 32)  # a row with the weight reads shared: (T(32) - T(16)) / 16


def m_values(a: argparse.Namespace) -> tuple[int, ...]:
    return tuple(range(1, a.m_max + 1))


def _sha(path: Path) -> str | None:
    return hashlib.sha256(path.read_bytes()).hexdigest() if path.is_file() else None


CPU_DIR = "ggml/src/ggml-cpu/"  # the sources of libggml-cpu
CPU_LIB = "libggml-cpu.so"


def patched_files(texts: list[str]) -> list[str]:
    """The files a set of unified diffs changes (their ``+++ b/...`` lines), in order."""
    out = []
    for text in texts:
        for ln in text.splitlines():
            if ln.startswith("+++ ") and ln[4:].strip() != "/dev/null":
                f = ln[4:].split("\t")[0].strip().removeprefix("b/")
                if f not in out:
                    out.append(f)
    return out


def assemble(installed_bin: Path, cpu_lib: Path, dest: Path) -> Path:
    """A library folder: the installed build's libraries (``lib*.so*``, links kept as links)
    with its libggml-cpu replaced by ``cpu_lib``. Refused when ``cpu_lib`` is the installed one
    (the comparison would measure one build twice)."""
    real = (installed_bin / CPU_LIB).resolve()
    if not real.is_file() or not (installed_bin / "libllama.so").is_file():
        raise SystemExit(f"error: {installed_bin} holds no {CPU_LIB} and libllama.so\nfix: run `make setup`")
    if _sha(cpu_lib) == _sha(real):
        raise SystemExit(f"error: {cpu_lib} is the installed build's own {CPU_LIB} (the same bytes): the comparison "
                         "would measure one build twice\nfix: delete its folder and run again, so the pinned "
                         "sources are built without labkit's patches")
    if dest.exists():
        shutil.rmtree(dest)
    dest.mkdir(parents=True)
    for f in sorted(installed_bin.iterdir()):
        if f.name.startswith("lib") and ".so" in f.name:
            if f.is_symlink():
                os.symlink(os.readlink(f), dest / f.name)  # relative, as the build made it
            else:
                shutil.copy2(f, dest / f.name)
    shutil.copy2(cpu_lib, dest / real.name)
    return dest


def portable_libdir(*, jobs: int | None = None) -> Path:
    """The pinned llama.cpp sources without labkit's patches, built with the installed build's
    flags (the portable ones unless LABKIT_CPU_VARIANT chose others), as a library folder for
    ``LLAMA_CPP_LIB_PATH``: the installed libraries with the unpatched libggml-cpu. The tree and
    its build are kept in ``$LABKIT_CACHE/bench/`` (keyed by version, flags and machine), so a
    second run compiles nothing. A patch that changes a file outside ggml-cpu is refused: then
    libggml-cpu alone would not be the unpatched build."""
    import platform

    from labkit.engines import native
    from labkit.errors import LabkitError
    from labkit.paths import cache_dir

    info = native.find(verify=True)
    if info is None or info["missing"]:
        raise SystemExit("error: no finished labkit llama.cpp build on this machine\nfix: run `make setup`")
    outside = [f for f in patched_files([Path(p["path"]).read_text() for p in native.patches()])
               if not f.startswith(CPU_DIR)]
    if outside:
        raise SystemExit(f"error: labkit's patches change {', '.join(outside)}, outside {CPU_DIR}: an unpatched "
                         f"{CPU_LIB} alone is not the unpatched build\nfix: build the unpatched tree whole "
                         "(native.extract_source(patched=False)) and pass its bin/ folder as portable=DIR")
    flags = info["cmake_args"]
    tag = hashlib.sha256(f"{native.VERSION}|{flags}|{native.BUILD_FLAGS}|{platform.machine()}".encode()).hexdigest()[:12]
    root = cache_dir() / "bench" / f"unpatched-{native.VERSION}-{tag}"
    built = root / "build" / "bin" / CPU_LIB
    log = root / "build.log"
    try:
        if not (root / "done.json").is_file():
            root.mkdir(parents=True, exist_ok=True)
            src = root / "src"
            if not (src / "CMakeLists.txt").is_file():
                shutil.rmtree(src, ignore_errors=True)
                print(f"portable: extracting llama.cpp {native.VERSION}'s pinned sources without labkit's patches "
                      f"into {src}", file=sys.stderr, flush=True)
                native.extract_source(native._sdist(cache_dir(), log, None), src, log, patched=False)
            print(f"portable: building {CPU_LIB} with {flags} (once; log: {log})", file=sys.stderr, flush=True)
            native._run(native.configure_command(src, root / "build", flags, gen=native.generator(root / "build")), log)
            native._run(["cmake", "--build", str(root / "build"), "--target", "ggml-cpu",
                         f"-j{jobs or os.cpu_count() or 2}"], log)
            (root / "done.json").write_text(json.dumps({
                "llama_cpp_python": native.VERSION, "cmake_args": flags, "patches": [],
                "sha256": {CPU_LIB: _sha(built.resolve())}, "built_at": time.strftime("%Y-%m-%dT%H:%M:%SZ")}, indent=1))
    except LabkitError as e:
        raise SystemExit(f"error: {e.problem}\nfix: {e.fix}") from None
    return assemble(Path(info["bin"]), built.resolve(), root / "lib")


def worker(a: argparse.Namespace) -> int:
    """One build: load the model, then answer `round SEED` / `profile` / `quit` on stdin."""
    from labkit.artifacts import zoo
    from labkit.engines.llamacpp import LlamaCppEngine, build_info
    from labkit.measure.verify_cost import _time_decode, context_ids

    model = zoo.get(a.model)
    clock = None
    if a.profile_worker:
        from labkit.measure.op_profile import NodeClock

        clock = NodeClock()
    engine = LlamaCppEngine(model.path, n_ctx=1024, n_threads=a.threads,
                            eval_callback=clock.callback if clock else None)
    info = build_info()
    say = lambda obj: print(json.dumps(obj), flush=True)  # noqa: E731
    if clock is not None:
        from labkit.measure.op_profile import profile_verify

        say(profile_verify(engine, clock, m_values=m_values(a), rounds=a.profile_rounds, kv_depth=a.kv_depth))
        return 0
    say({"ready": True, "lib_path": info.get("lib_path"), "lib_sha256": info.get("lib_sha256"),
         "system_info": info.get("system_info")})
    ctx = context_ids(engine, a.kv_depth, seed=0)
    rows = context_ids(engine, max(BIG_M), seed=1)
    engine.rollback(0)
    engine.decode(ctx, all_logits=False)
    shapes = [(m, True) for m in m_values(a)] + [(m, logits) for m in BIG_M for logits in (True, False)]
    for m, logits in shapes:  # warm-up: every shape once, through the measured code path
        _time_decode(engine, rows[:m], a.kv_depth, all_logits=logits)
    for line in sys.stdin:
        cmd = line.split()
        if not cmd or cmd[0] == "quit":
            break
        rng = np.random.default_rng(int(cmd[1]))
        out = {}
        for i in rng.permutation(len(shapes)):
            m, logits = shapes[i]
            out[str(m) if logits else f"{m}b"] = _time_decode(engine, rows[:m], a.kv_depth, all_logits=logits)
        say(out)
    engine.close()
    return 0


def _spawn(libdir: str, a: argparse.Namespace, *, profile: bool = False) -> subprocess.Popen:
    env = dict(os.environ)
    if libdir:
        env["LLAMA_CPP_LIB_PATH"] = libdir
    cmd = [sys.executable, __file__, "--worker", "--model", a.model, "--threads", str(a.threads),
           "--kv-depth", str(a.kv_depth), "--profile-rounds", str(a.profile_rounds), "--m-max", str(a.m_max)]
    if profile:
        cmd.append("--profile-worker")
    return subprocess.Popen(cmd, env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)


def _read(p: subprocess.Popen, name: str) -> dict:
    line = p.stdout.readline()
    if not line:
        raise SystemExit(f"the worker for {name} stopped (exit {p.wait()}); its stderr is above")
    return json.loads(line)


def _ratio(num: list[float], den: list[float]):
    from labkit.analysis.decide import LOSES, WINS, estimate

    pairs = pd.DataFrame({"prompt": "verify", "round": range(len(num)),
                          "ratio": np.asarray(num) / np.asarray(den)})
    e = estimate(pairs)
    # a ratio of times: below 1 the numerator is faster (decide's "wins" reads ratio > 1, a speedup)
    reads = {WINS: "slower", LOSES: "faster"}.get(e.verdict, "no measurable difference")
    return {"ratio": round(e.ratio, 3), "lo": round(e.lo, 3), "hi": round(e.hi, 3), "reads": reads,
            "text": f"{e.ci_text()}, {reads}"}


def amortised(s: dict) -> dict:
    """One more row with the weight reads shared by 16..32 rows, beside one more row of a verify
    (m = 1..8); ``s`` maps an m (``"16b"``: one logit row) to its ms per round."""
    (lo, hi), n = BIG_M, BIG_M[1] - BIG_M[0]
    full = (np.asarray(s[str(hi)]) - np.asarray(s[str(lo)])) / n
    body = (np.asarray(s[f"{hi}b"]) - np.asarray(s[f"{lo}b"])) / n
    top = max(M_VALUES)
    small = (np.asarray(s[str(top)]) - np.asarray(s["1"])) / (top - 1)
    return {"from_m": list(BIG_M), "row_ms": round(float(np.median(full)), 2),
            "body_row_ms": round(float(np.median(body)), 2), "head_row_ms": round(float(np.median(full - body)), 2),
            "small_m_row_ms": round(float(np.median(small)), 2), "small_m_over_amortised": _ratio(list(small), list(full))}


def parse_builds(specs: list[str]) -> dict[str, str]:
    """``[NAME=]LIBDIR`` arguments as name -> library folder ("" the installed build); a folder
    without libllama.so is refused. The name defaults to the folder above ``bin/``."""
    builds = {}
    for spec in specs:
        name, _, d = spec.rpartition("=") if "=" in spec else ("", "", spec)
        if d and not (Path(d) / "libllama.so").is_file():
            raise SystemExit(f"error: {d} holds no libllama.so\nfix: pass the bin/ folder of a llama.cpp build")
        name = name or (Path(d).parent.name if d else "installed")
        if name in builds:  # two unnamed .../build/bin folders: one would silently replace the other
            raise SystemExit(f"error: two builds are named {name!r}\nfix: name each, e.g. a={builds[name] or 'DIR'} b={d}")
        builds[name] = d
    return builds


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("libs", nargs="*", help="[NAME=]LIBDIR, each a folder holding libllama and libggml*")
    ap.add_argument("--rounds", type=int, default=24)
    ap.add_argument("--kv-depth", type=int, default=200)
    ap.add_argument("--threads", type=int, default=min(2, os.cpu_count() or 1))
    ap.add_argument("--model", default="gemma-3-270m-q4_k_m")
    ap.add_argument("--profile", action="store_true", help="also the per-op-class breakdown of each build")
    ap.add_argument("--profile-rounds", type=int, default=5)
    ap.add_argument("--m-max", type=int, default=max(M_VALUES),
                    help=f"time verify(m) for m = 1..M (default {max(M_VALUES)}; at most {BIG_M[0] - 1})")
    ap.add_argument("--portable", action="store_true",
                    help="first, as the reference: the pinned sources without labkit's patches, the installed "
                         "build's flags (built once into $LABKIT_CACHE/bench/; named unpatched where those are not "
                         "the portable flags); no LIBDIR: the installed build next, as labkit")
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--profile-worker", action="store_true", help=argparse.SUPPRESS)
    a = ap.parse_args(argv)
    if not max(M_VALUES) <= a.m_max < BIG_M[0]:
        raise SystemExit(f"error: --m-max {a.m_max}: the targets need m = 1..{max(M_VALUES)}, and m = {BIG_M[0]} is "
                         f"timed already (the amortised row)\nfix: give --m-max between {max(M_VALUES)} and {BIG_M[0] - 1}")
    if a.worker:
        return worker(a)
    if a.portable and any(spec.rpartition("=")[0] in ("portable", "unpatched") for spec in a.libs):
        raise SystemExit("error: --portable and a build named portable= or unpatched=\nfix: give one of them")
    builds = parse_builds(a.libs or (["labkit="] if a.portable else [""]))
    ref = None
    if a.portable:
        from labkit.engines.native import PORTABLE_FLAGS

        d = portable_libdir()
        made = json.loads((d.parent / "done.json").read_text())
        # the portable build is upstream's sources with the portable flags; with a variant's
        # flags (LABKIT_CPU_VARIANT) the reference is that variant unpatched, and says so
        ref = "portable" if made["cmake_args"] == PORTABLE_FLAGS else "unpatched"
        builds = {ref: str(d), **builds}
    procs = {n: _spawn(d, a) for n, d in builds.items()}
    meta = {n: _read(p, n) for n, p in procs.items()}
    for n, d in builds.items():
        loaded = Path(d) if d else Path(meta[n].get("lib_path") or ".").parent  # the installed: where it loaded from
        meta[n]["libggml_cpu_sha256"] = _sha(loaded / CPU_LIB)
    if ref:  # how the reference was made, beside what its worker loaded
        meta[ref]["made"] = made
    samples = {n: {} for n in builds}
    rng = np.random.default_rng(0)
    for r in range(a.rounds):
        for n in rng.permutation(list(builds)):
            procs[n].stdin.write(f"round {r}\n")
            procs[n].stdin.flush()
            for m, ms in _read(procs[n], n).items():
                samples[n].setdefault(m, []).append(ms)
        print(f"round {r + 1}/{a.rounds}", file=sys.stderr, flush=True)
    for p in procs.values():
        p.stdin.write("quit\n")
        p.stdin.close()
        p.wait()
    from labkit.artifacts import zoo

    first = next(iter(builds))
    out = {"kind": "verify_kernels", "rounds": a.rounds, "kv_depth": a.kv_depth, "threads": a.threads,
           "model": a.model, "order": "builds in a fresh random order each round; m in a fresh order within",
           "builds": {}}
    art = zoo.get(a.model)
    if art.synthetic:
        out["label"] = art.describe()["label"]
    for n in builds:
        s, s0 = samples[n], samples[first]
        out["builds"][n] = {
            **meta[n], "lib_dir": builds[n],
            "H_ms": round(float(np.median(s["1"])), 2),
            "verify_ms": {m: round(float(np.median(s[str(m)])), 2) for m in m_values(a)},
            "verify_over_H": {m: _ratio(s[str(m)], s["1"]) for m in m_values(a)},
            **({f"over_{first}": {m: _ratio(s[str(m)], s0[str(m)]) for m in m_values(a)}} if n != first else {}),
            "amortised": amortised(s),
        }
    if a.profile:
        for n, d in builds.items():
            p = _spawn(d, a, profile=True)
            out["builds"][n]["op_profile"] = _read(p, n)
            p.wait()
    for n, b in out["builds"].items():
        print(f"{n}: H {b['H_ms']} ms; " + ", ".join(f"V({m})/H {b['verify_over_H'][m]['text']}" for m in m_values(a)[1:]),
              file=sys.stderr)
        f = b["amortised"]
        print(f"{n}: one more row costs {f['small_m_row_ms']} ms in a verify (m = 1..8) and {f['row_ms']} ms with "
              f"the weight reads shared by {BIG_M[0]}..{BIG_M[1]} rows (body {f['body_row_ms']}, head "
              f"{f['head_row_ms']}): verify / shared {f['small_m_over_amortised']['text']}", file=sys.stderr)
    print(json.dumps(out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
