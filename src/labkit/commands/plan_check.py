"""`labkit plan --check` and `--published` (the plan command's two measuring/reading modes)."""

from __future__ import annotations

from labkit.commands import output, progress


def run(args=None, *, rounds: int = 8, sweep: bool = True) -> int:
    """Predict this box's models, measure them, print both with the error, keep the residual."""
    from labkit.commands.machine import log_run
    from labkit.engines.llamacpp_lib import build_info
    from labkit.measure import machine, plancheck
    from labkit.provenance.fingerprint import host_info

    host, build = host_info(), build_info()
    from labkit.suites.workloads import load_workload

    prof = machine.load("this", host=host, build=build)
    prompts = [p for w in plancheck.SWEEP_WORKLOADS for p in load_workload(w, limit=1)] if sweep else None
    res = plancheck.run_check(prof, prompts=prompts, rounds=rounds, progress=progress)
    prof = machine.with_residual(prof, res["residual"])
    path = machine.save(prof)
    lab = log_run(prof, name="plan-check", table=res["verify"])
    lines = [*plancheck.summary_lines(res), f"residual stored in {path}; logged [{lab}]"]
    output(args, lines, {"residual": res["residual"], "verify": res["verify"].to_dict("records"),
          "cells": None if res["cells"] is None else res["cells"].to_dict("records"), "seconds": res["seconds"],
          "label": res["label"], "lab_id": lab})
    return 0


def published(args=None) -> int:
    """The planner beside the seeds' published §E cells (data/published/seeds.yaml)."""
    from labkit.analysis import plan_published
    from labkit.artifacts import published as pub

    data = pub.load()
    res = plan_published.compare(data, pub.model_profiles(data))
    output(args, plan_published.summary_lines(res), res)
    return 0
