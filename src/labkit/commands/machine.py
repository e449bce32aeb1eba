"""``labkit machine``: this host's measured profile for `labkit plan`.

    labkit machine probe            # measure (~1 minute), cache per host + build, log an MLflow run
    labkit machine show             # the cached profiles, this host's first

The probe measures host memory bandwidth (a multi-threaded streaming read of a 1 GiB buffer),
per-device bandwidth where an accelerator exists (else "not measured: reason"), the engine's
fixed per-step overhead, and verify(m) for m = 1..8 on the embedded model (the per-row compute
rates). It is recorded with the host fingerprint and the engine build.
"""

from __future__ import annotations

import argparse

from labkit.commands import add_json_flag, output, progress


def setup_arg_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="labkit machine", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("action", choices=["probe", "show"], help="probe: measure and cache; show: list cached profiles")
    p.add_argument("--rounds", type=int, default=16, help="verify(m) rounds on the embedded model (default 16)")
    p.add_argument("--threads", type=int, default=None, help="threads (default: the engine's default)")
    p.add_argument("--gib", type=float, default=1.0, help="bandwidth buffer in GiB (default 1; far above caches)")
    p.add_argument("--no-log", action="store_true", help="do not log the probe as an MLflow run")
    return add_json_flag(p)


def log_run(profile: dict, *, name: str = "machine-probe", table=None) -> str | None:
    """The profile as an MLflow run (tags: host, key; the profile JSON as an artifact); its LAB ID."""
    from labkit.config.recipe import load
    from labkit.provenance import tracking
    from labkit.provenance.fingerprint import git_info

    c = tracking.client()
    host = profile.get("host_fingerprint") or {}
    tags = {"lab.mode": "command", "lab.notebook": name, "host.label": host.get("label"), "machine.key": profile["key"],
            "git.commit": git_info()["commit"], "recipe": "default"}
    rid, lab = tracking.new_run(c, notebook=name, recipe=load("default"), tags=tags, run_name=f"labkit {name}",
                                source=f"labkit {name.replace('-', ' ')}")
    tracking.log_json(c, rid, profile, "machine-profile.json")
    c.log_metric(rid, "host_bandwidth_gbs", profile["host"]["bandwidth_gbs"])
    c.log_metric(rid, "overhead_ms", profile["overhead_ms"])
    if profile.get("residual"):
        c.log_metric(rid, "verify_median_abs_error", profile["residual"]["verify_median_abs_error"])
    if table is not None:
        tracking.log_json(c, rid, table.to_dict("records"), "plan-check.json")
    c.set_terminated(rid, "FINISHED")
    return str(lab)


def main(argv=None) -> int:
    args = setup_arg_parser().parse_args(argv)
    from labkit.engines.llamacpp_lib import build_info
    from labkit.measure import machine
    from labkit.provenance.fingerprint import host_info

    host = host_info()
    if args.action == "show":
        key = machine.cache_key(host, build_info())
        rows = sorted(machine.cached(), key=lambda d: d.get("key") != key)
        lines = []
        for d in rows:
            h = d.get("host_fingerprint") or {}
            mark = "this host" if d.get("key") == key else "another host/build"
            lines.append(f"{h.get('label')}: host {d['host']['bandwidth_gbs']:.1f} GB/s, overhead "
                         f"{d['overhead_ms']:.2f} ms, {d.get('device_note') or 'device measured'} ({mark}; "
                         f"{d.get('measured_at')})" + (f" [{d['lab_id']}]" if d.get("lab_id") else ""))
        output(args, lines or ["no machine profile cached yet: `labkit machine probe` measures this host (~1 min)"],
               {"profiles": [{k: d.get(k) for k in ("key", "host_fingerprint", "host", "overhead_ms", "device_note",
                                                    "residual", "_path")} for d in rows]})
        return 0
    prof = machine.probe(host=host, build=build_info(), threads=args.threads, rounds=args.rounds, gib=args.gib,
                         progress=progress)
    prev = [d for d in machine.cached() if d.get("key") == prof["key"]]
    if prev and prev[-1].get("residual"):  # a re-probe keeps the record of how right plans were (marked as older)
        prof["residual"] = {**prev[-1]["residual"], "note": "from the previous profile of this host and build"}
    path = machine.save(prof)
    prof["lab_id"] = None if args.no_log else log_run(prof)
    if prof["lab_id"]:
        machine.save(prof)
    cal = prof["calibration"]
    output(args, [
        f"host bandwidth {prof['host']['bandwidth_gbs']:.1f} GB/s ({prof['host']['bandwidth']['min']:.1f}–"
        f"{prof['host']['bandwidth']['max']:.1f}, {prof['host']['bandwidth']['threads']} threads"
        + ("" if prof["host"].get("bandwidth_from", machine.STREAM_READ) == machine.STREAM_READ
           else f"; from {prof['host']['bandwidth_from']}") + "); "
        f"device: {prof['device_note']}",
        f"fixed per-step overhead {prof['overhead_ms']:.2f} ms; {cal['model']}: H {cal['H_ms']:.1f} ms, "
        f"+{cal['fit']['b']:.2f} ms per row (fit r² {cal['fit']['r2']:.2f})",
        f"saved {path}" + (f"; logged [{prof['lab_id']}]" if prof["lab_id"] else ""),
    ], {**prof, "_path": str(path)})
    return 0
