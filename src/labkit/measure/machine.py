"""The machine profile: the few numbers the planner prices a step with, measured on this host.

- host bandwidth: a multi-threaded streaming read (numpy sums, which release the GIL) over a
  buffer far larger than the caches; median and range over repeats, GB/s.
- device bandwidth: measured only where an accelerator exists and the engine can reach it;
  otherwise "not measured: <reason>" (never a guess).
- the engine's fixed per-step overhead: the plain step of a tiny SYNTHETIC model (a few
  hundred kB of weights), where graph building and thread sync are all there is to time.
- compute: verify(m) for m = 1..8 on the embedded model (``verify_cost.bench_verify``),
  turned into ns per parameter: the first row (what the one-row step costs beyond reading its
  bytes), the step from one row to a batch, each further row, and the extra of an odd row
  count (row-pair kernels).

The profile is cached per host and engine build (``$LABKIT_CACHE/machine/``); a plan on this
host finds it there. A profile from another host is used only when named (``--profile``).
"""

from __future__ import annotations

import hashlib
import json
import os
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np

from labkit.analysis.costmodel import fit_verify, fit_verify_model, verify_frame
from labkit.analysis.plan import head_params
from labkit.artifacts import synthetic, zoo
from labkit.artifacts.gguf_profile import DENSE_CATEGORIES, read_profile
from labkit.errors import LabkitError
from labkit.measure import verify_cost
from labkit.measure.verify_cost import Progress
from labkit.paths import cache_dir

PROFILE_VERSION = 2  # 2: the head's rates (HEAD_RATES) beside the body's
STREAM_READ = "streaming read"  # ``host.bandwidth_from`` where the streaming probe is the bandwidth
TINY = "plan-tiny"  # SYNTHETIC: the overhead probe's model
TINY_CONFIG = {"arch": "llama", "n_vocab": 512, "n_embd": 64, "n_layer": 2, "n_head": 4, "n_head_kv": 2,
               "n_ff": 128, **{k: v for k, v in synthetic._COMMON.items()}}


# the compute rates the probe calibrates (``calibrate``), ns per parameter; the head's are
# per parameter of an output matrix the CPU backend leaves unrepacked (plan.head_params), None
# where the probe did not separate them (the head then priced at the body's rates)
COMPUTE_RATES = ("matvec_ns_per_param", "row_ns_per_param", "batch_ns_per_param", "odd_ns_per_param")
HEAD_RATES = ("head_row_ns_per_param", "head_batch_ns_per_param", "head_odd_ns_per_param")
# per m (2..8, keys "2".."8"): the measured extra of m rows over one, ns per parameter, per class;
# the planner prices a whole row count from these where it has one (the kernels' tiles make
# the extra a staircase in m, not a line), from the linear rates above elsewhere
RATE_TABLES = ("rows_ns_per_param_by_m", "head_rows_ns_per_param_by_m")


_UNITS = {"": 1, "K": 2**10, "M": 2**20, "G": 2**30}


def llc_bytes(root: str | Path = "/sys/devices/system/cpu/cpu0/cache") -> int | None:
    """The last-level CPU cache this host reports (sysfs: the highest cache level of CPU 0,
    e.g. ``491520K``), in bytes; None where the kernel says nothing (no sysfs, another OS)."""
    best: tuple[int, int] | None = None
    for d in sorted(Path(root).glob("index*")):
        try:
            level, text = int((d / "level").read_text()), (d / "size").read_text().strip().upper()
        except (OSError, ValueError):
            continue
        num, unit = text.rstrip("KMGB"), text[len(text.rstrip("KMGB")):].rstrip("B")
        if not num.isdigit() or unit not in _UNITS:
            continue
        size = int(num) * _UNITS[unit]
        if best is None or (level, size) > best:
            best = (level, size)
    return best[1] if best else None


def cache_flusher(llc: int | None):
    """A callable that evicts this host's caches (a read of twice the last-level cache, at
    least 256 MiB and at most 2 GiB): what a decode of a model larger than the cache meets
    every step."""
    buf = np.ones(min(max(2 * (llc or 0), 256 * 2**20), 2 * 2**30) // 8)
    return lambda: float(buf.sum())


def host_bandwidth(*, threads: int | None = None, gib: float = 1.0, repeats: int = 5) -> dict:
    """GB/s of a streaming read of ``gib`` GiB split over ``threads`` threads (median, range)."""
    threads = threads or os.cpu_count() or 1
    n = int(gib * 2**30) // 4
    buf = np.ones(n, dtype=np.float32)  # touched once here, so the pages exist before timing
    parts = np.array_split(buf, threads)
    samples = []
    with ThreadPoolExecutor(threads) as pool:
        list(pool.map(np.sum, parts))  # warm-up: the same code path
        for _ in range(repeats):
            t0 = time.perf_counter()
            list(pool.map(np.sum, parts))
            samples.append(buf.nbytes / (time.perf_counter() - t0) / 1e9)
    del parts, buf
    return {"median": float(np.median(samples)), "min": float(min(samples)), "max": float(max(samples)),
            "n": repeats, "threads": threads, "buffer_gib": gib, "method": "numpy float32 sums, one slice per thread"}


def device_bandwidth(accelerator: str, build: dict) -> dict:
    """Measured where possible; here: why not."""
    if not accelerator or accelerator == "none":
        return {"measured": False, "note": "not measured: no accelerator"}
    if not build.get("gpu_offload_supported"):
        return {"measured": False, "note": f"not measured: {accelerator} present but this llama.cpp build "
                                           "cannot offload (built for CPU)"}
    return {"measured": False, "note": f"not measured: {accelerator}; a device bandwidth probe through the engine's "
                                       "backend is not implemented yet"}


def _tiny_model() -> Path:
    """The overhead probe's SYNTHETIC model, written once into the cache."""
    path = cache_dir() / "machine" / f"{TINY}.gguf"
    if not path.exists():
        path.parent.mkdir(parents=True, exist_ok=True)
        synthetic.CONFIGS.setdefault(TINY, TINY_CONFIG)
        tmp = path.with_name(f"{path.name}.{os.getpid()}.partial")  # two processes may write it at once
        synthetic.write(TINY, tmp)
        os.replace(tmp, path)
    return path


def bench_model(path, *, m_values, rounds: int, kv_depth: int, threads: int | None, body: bool = False,
                before=None, progress: Progress = None) -> dict:
    """verify(m) of the GGUF at ``path`` (``bench_verify`` on a fresh llama.cpp engine;
    ``before``: run before each timed decode, untimed)."""
    from labkit.engines.llamacpp import LlamaCppEngine

    with LlamaCppEngine(str(path), n_ctx=max(512, kv_depth + max(m_values) + 8), n_threads=threads) as e:
        return verify_cost.bench_verify(e, m_values=m_values, rounds=rounds, kv_depth=kv_depth, body=body,
                                        before=before, progress=progress)


def active_params(prof) -> dict:
    """Bytes a one-row step reads and parameters it multiplies by (routed experts: u of E)."""
    b = el = 0.0
    for lay in prof.trunk:
        b += sum(lay.bytes[c] for c in DENSE_CATEGORIES)
        el += sum(lay.elements[c] for c in DENSE_CATEGORIES)
        if prof.n_expert:
            b += prof.n_expert_used * lay.bytes["experts"] / prof.n_expert
            el += prof.n_expert_used * lay.elements["experts"] / prof.n_expert
    return {"bytes": b + prof.output_bytes, "params": el + prof.output_elements}


def calibrate(res: dict, prof, *, bandwidth_gbs: float, overhead_ms: float) -> dict:
    """Compute rates (ns per parameter) from a verify(m) bench of the model ``prof``: the
    first row beyond its bytes' read time, each further row, the step to a batch kernel and
    the odd-row extra. Where the bench also timed one logit row per decode (``body``) and the
    model's head is one the CPU backend leaves unrepacked (``plan.head_params``), the rows
    beyond the first are priced in two classes, as the per-op profile splits them: the body
    (every weight but the head) from the one-logit-row decodes, and the head from the
    difference, every-row minus one-row, round by round. Else one class, as before."""
    vm = fit_verify_model(verify_frame(res))
    act = active_params(prof)
    read_ms = act["bytes"] / (bandwidth_gbs * 1e6)
    # A plain step that read its bytes faster than the streaming probe says the box can proves
    # the box reads at least that fast: the probe under-read (a neighbour busy while it ran, a
    # slow moment). The decode's own rate is then the bandwidth, so that the one-row step is H
    # by construction; the streaming read is kept beside it (``bandwidth_from``).
    read_gbs, bandwidth_from = bandwidth_gbs, STREAM_READ
    if 0.0 < vm.H - overhead_ms < read_ms:
        read_ms = vm.H - overhead_ms
        read_gbs, bandwidth_from = act["bytes"] / (read_ms * 1e6), (
            f"the calibration model's plain step (it read its "
            f"{act['bytes'] / 1e6:.0f} MB faster than the streaming read's {bandwidth_gbs:.1f} GB/s)")
    first = max(0.0, vm.H - overhead_ms - read_ms)
    head = head_params(prof) if res.get("body") else 0.0
    body_fit = _line(res["body"]) if head else vm.fit
    extra = _line(res["head_extra"]) if head else None
    n = act["params"] - head  # the rows beyond the first: every parameter but a separately priced head
    # verify(m >= 2) = a + b*m measured; H + (m-1)*b priced: the difference is the batch step
    batch = body_fit.a + body_fit.b - vm.H
    body = res["body"] if head else res["verify"]
    out = {"matvec_ns_per_param": first / act["params"] * 1e6, "row_ns_per_param": body_fit.b / n * 1e6,
           "batch_ns_per_param": batch / n * 1e6, "odd_ns_per_param": (body_fit.parity or 0.0) / n * 1e6,
           **dict.fromkeys(HEAD_RATES + RATE_TABLES), "H_ms": vm.H,
           "rows_ns_per_param_by_m": {str(r["m"]): (r["median"] - vm.H) / n * 1e6 for r in body if r["m"] >= 2},
           "fit": _fit_dict(vm.fit), "read_ms": read_ms, "bandwidth_gbs": read_gbs, "bandwidth_from": bandwidth_from,
           "stream_bandwidth_gbs": bandwidth_gbs, "active_bytes": act["bytes"], "active_params": act["params"], "head_params": head}
    if head:  # the head's extra over its one row: a + b*m on m >= 2 is (m - 1)*b + (a + b)
        out.update({"head_row_ns_per_param": extra.b / head * 1e6,
                    "head_batch_ns_per_param": (extra.a + extra.b) / head * 1e6,
                    "head_odd_ns_per_param": (extra.parity or 0.0) / head * 1e6,
                    "head_rows_ns_per_param_by_m": {str(r["m"]): float(np.median(r["values"])) / head * 1e6
                                                    for r in res["head_extra"]},
                    "body_fit": _fit_dict(body_fit), "head_fit": _fit_dict(extra)})
    return out


def _line(rows: list[dict]):
    """a + b·m (+ an odd-m term with three or more m) through every sample of ``rows`` (m >= 2),
    as ``fit_verify_model`` fits verify(m >= 2)."""
    f = verify_frame({"verify": rows})
    return fit_verify(f, parity=f["m"].nunique() >= 3)


def _fit_dict(fit) -> dict:
    return {"a": fit.a, "b": fit.b, "parity": fit.parity, "r2": fit.r2}


def probe(*, host: dict, build: dict, threads: int | None = None, rounds: int = 16, gib: float = 1.0,
          kv_depth: int = 200, model: str = "gemma-3-270m-q4_k_m", progress: Progress = None) -> dict:
    """Measure this host's profile (see the module doc). ``host``: the fingerprint; ``build``:
    the engine's build info (both recorded and part of the cache key)."""
    say = progress or (lambda _msg: None)
    n_threads = threads or os.cpu_count() or 1
    say(f"host bandwidth: streaming read of {gib:g} GiB, {n_threads} threads")
    bw = host_bandwidth(threads=n_threads, gib=gib)
    say(f"host bandwidth {bw['median']:.1f} GB/s ({bw['min']:.1f}–{bw['max']:.1f})")
    by_threads = {n_threads: bw["median"]}
    for t in range(1, n_threads):  # what a plan at fewer threads reads (``at_threads``)
        by_threads[t] = host_bandwidth(threads=t, gib=gib)["median"]
        say(f"host bandwidth at {t} thread(s): {by_threads[t]:.1f} GB/s")
    dev = device_bandwidth(host.get("accelerator", "none"), build)
    say("fixed per-step overhead: the plain step of a tiny SYNTHETIC model")
    tiny = bench_model(_tiny_model(), m_values=[1], rounds=max(8, rounds), kv_depth=32, threads=threads)
    overhead = float(tiny["H_ms"]["median"])
    art = zoo.get(model)
    say(f"verify(m) m = 1..8 on {art.name}, {rounds} rounds")
    res = bench_model(art.path, m_values=list(range(1, 9)), rounds=rounds, kv_depth=kv_depth, threads=threads,
                      body=True, progress=progress)
    cal = calibrate(res, read_profile(art.path), bandwidth_gbs=bw["median"], overhead_ms=overhead)
    return {
        "version": PROFILE_VERSION, "kind": "measured", "key": cache_key(host, build),
        "host_fingerprint": host, "build": {k: build.get(k) for k in ("llama_cpp_python", "cmake_args", "system_info", "patches")},
        "measured_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "threads": n_threads,
        "host": {"bandwidth_gbs": cal["bandwidth_gbs"], "bandwidth_from": cal["bandwidth_from"], "bandwidth": bw,
                 "bandwidth_by_threads": {str(t): v for t, v in sorted({**by_threads, n_threads: cal["bandwidth_gbs"]}.items())},
                 **{k: cal[k] for k in COMPUTE_RATES + HEAD_RATES + RATE_TABLES}},
        "device": None, "device_note": dev["note"], "overhead_ms": overhead,
        "overhead": {"model": f"{TINY} (SYNTHETIC, {TINY_CONFIG['n_layer']} layers, n_embd {TINY_CONFIG['n_embd']})",
                     "H_ms": tiny["H_ms"]},
        "calibration": {"model": art.name, "model_sha256": art.sha256, "kv_depth": kv_depth, "rounds": rounds,
                        **cal, "verify": res["verify"], "body": res.get("body")},
        "residual": None,
    }


def at_threads(profile: dict, n: int | None) -> dict:
    """The profile as a plan at ``n`` threads sees it: the host bandwidth measured at n threads
    (the probe reads at every count up to its own), the compute rates scaled by T/n from the
    T threads they were measured at (the assumption: the kernels split their work evenly over
    threads; ``plan --check`` measures how true that is), the fixed overhead unchanged. None or
    the probe's own count: the profile itself."""
    T = int(profile.get("threads") or (profile.get("host", {}).get("bandwidth") or {}).get("threads") or 0)
    if n is None or n == T:
        return profile
    if n < 1:
        raise LabkitError(f"--threads {n}", "use at least 1 thread")
    measured = (profile.get("host") or {}).get("bandwidth_by_threads") or {}
    if str(n) not in measured:
        have = ", ".join(sorted(measured, key=int)) or (str(T) if T else "none")
        raise LabkitError(f"the machine profile has no host bandwidth at {n} thread(s) (measured at: {have})",
                          f"plan at one of those thread counts, or re-run `labkit machine probe` "
                          f"(it reads bandwidth at 1..{T or 'all'} threads; --threads {n} probes up to {n})")
    if not T:
        raise LabkitError("the machine profile does not say how many threads it was measured at",
                          "re-run `labkit machine probe`")
    host = {**profile["host"], "bandwidth_gbs": float(measured[str(n)]),
            **{k: float(profile["host"].get(k) or 0.0) * T / n for k in COMPUTE_RATES},
            **{k: _scaled(profile["host"].get(k), T / n) for k in HEAD_RATES + RATE_TABLES}}
    return {**profile, "host": host, "threads": n,
            "derived": f"from the {T}-thread probe: host bandwidth measured at {n} thread(s), compute rates scaled "
                       f"{T}/{n} (assumed: work splits evenly over threads)"}


def _scaled(rate, factor: float):
    """A rate (or a per-m table of them) times ``factor``; None (not measured) stays None."""
    if rate is None:
        return None
    return {m: float(v) * factor for m, v in rate.items()} if isinstance(rate, dict) else float(rate) * factor


# -- the cache ------------------------------------------------------------------------------
def cache_key(host: dict, build: dict) -> str:
    ident = {k: host.get(k) for k in ("label", "cpu", "cpu_id", "cores", "memory_bytes", "accelerator")}
    ident["build"] = {k: build.get(k) for k in ("llama_cpp_python", "cmake_args", "system_info")}
    # a build with other patches is another build (its kernels, so its rates); a profile of
    # another version has other terms: neither is this host's profile
    ident["build"]["patches"] = [p.get("sha256") for p in build.get("patches") or []]
    ident["version"] = PROFILE_VERSION
    return hashlib.sha256(json.dumps(ident, sort_keys=True, default=str).encode()).hexdigest()[:16]


def profiles_dir() -> Path:
    d = cache_dir() / "machine"
    d.mkdir(parents=True, exist_ok=True)
    return d


def save(profile: dict) -> Path:
    path = profiles_dir() / f"profile-{profile['key']}.json"
    tmp = path.with_suffix(f".{os.getpid()}.partial")  # two processes may save at once
    tmp.write_text(json.dumps(profile, indent=1, default=str))
    os.replace(tmp, path)
    return path


def cached() -> list[dict]:
    out = []
    for p in sorted(profiles_dir().glob("profile-*.json")):
        try:
            d = json.loads(p.read_text())
        except (OSError, ValueError):
            continue
        d["_path"] = str(p)
        out.append(d)
    return out


def load(name: str, *, host: dict, build: dict) -> dict:
    """The profile ``name`` names: "this" (this host and build, from the cache), a JSON file,
    or another host's label among the cached profiles (named, so used knowingly)."""
    key = cache_key(host, build)
    if name.endswith(".json") or os.sep in name:
        p = Path(name).expanduser()
        if not p.is_file():
            raise LabkitError(f"machine profile not found: {p}", "give a profile JSON written by labkit machine probe")
        d = json.loads(p.read_text())
        d["_path"] = str(p)
        return d
    profiles = cached()
    if name == "this":
        mine = [d for d in profiles if d.get("key") == key]
        if mine:
            return mine[-1]
        others = sorted({(d.get("host_fingerprint") or {}).get("label", "?") for d in profiles})
        if others:
            raise LabkitError(f"the cached machine profiles are from other hosts or builds ({', '.join(others)}); "
                              f"this host is {host.get('label')!r}",
                              "run `labkit machine probe` here, or name one with --profile LABEL to plan for that box")
        raise LabkitError("no machine profile for this host yet", "run `labkit machine probe` first (~1 minute)")
    named = [d for d in profiles if (d.get("host_fingerprint") or {}).get("label") == name]
    if not named:
        known = sorted({(d.get("host_fingerprint") or {}).get("label", "?") for d in profiles}) or ["none cached"]
        raise LabkitError(f"no cached machine profile for host {name!r}",
                          f"use --profile this, a profile JSON path, or one of: {', '.join(known)}")
    return named[-1]


def with_residual(profile: dict, check: dict) -> dict:
    """The profile with ``check``'s residuals recorded (later plans say how right they were)."""
    return {**{k: v for k, v in profile.items() if k != "_path"}, "residual": check}


def load_or_probe(*, host: dict, build: dict, rounds: int = 8, threads: int | None = None,
                  progress: Progress = None) -> dict:
    """This host's cached profile, or a fresh (short) probe saved for next time."""
    try:
        return load("this", host=host, build=build)
    except LabkitError:
        if progress:
            progress("no machine profile for this host and build yet: probing now")
        prof = probe(host=host, build=build, rounds=rounds, threads=threads, progress=progress)
        save(prof)
        return prof
