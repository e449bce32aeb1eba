"""``labkit plan``: predict the §E matrix (and §B per c) for a model, a placement and a box,
from the model's GGUF header and a machine profile; ``--check`` measures this box's models and
compares (the residual is kept in the profile, so later plans say how right they have been).

    labkit plan --model big-moe.gguf --profile this --n-cpu-moe 0,10,14,24 --n-max 0..4 \\
                --acceptance 0.85,0.7,0.59
    labkit plan --model gemma-3-270m-q4_k_m --acceptance LAB:02-3fa2c1-k7q2m --c 1,2,4
    labkit plan --model gemma-3-270m-q4_k_m --acceptance replay:LAB:02-3fa2c1-k7q2m --n-max 0..8
    labkit plan --check                     # predicted vs measured on this box
    labkit plan --published                 # the planner beside the seeds' published numbers
"""

from __future__ import annotations

import argparse
import re

from labkit.commands import add_json_flag, output, progress
from labkit.errors import LabkitError


def int_list(text: str, *, what: str) -> list[int]:
    """ "0..4", "1-8", "1,2,4" or a mix -> sorted distinct ints."""
    out: set[int] = set()
    for part in str(text).split(","):
        part = part.strip()
        m = re.fullmatch(r"(-?\d+)\s*(?:\.\.|-)\s*(\d+)", part)
        try:
            if m:
                lo, hi = int(m.group(1)), int(m.group(2))
                if hi < lo:
                    raise ValueError
                out.update(range(lo, hi + 1))
            else:
                out.add(int(part))
        except ValueError:
            raise LabkitError(f"{what} {text!r} is not a list of integers",
                              f"write e.g. {what} 0..4 or {what} 1,2,4") from None
    return sorted(out)


def setup_arg_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="labkit plan", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", help="a GGUF (only its header is read; a header-only file will do) or a zoo name")
    p.add_argument("--profile", default="this",
                   help="machine profile: 'this' (this host's, from labkit machine probe), a host label among the "
                        "cached profiles, or a profile JSON (default: this)")
    p.add_argument("--gpu-layers", default="0", help="layers on the device, a list or range (default 0)")
    p.add_argument("--n-cpu-moe", default="0", help="expert tensors of the first N layers on the host (default 0)")
    p.add_argument("--n-max", default="0..4", help="draft lengths (default 0..4; 0 is plain decoding)")
    p.add_argument("--c", default="1", help="concurrent streams for §B (default 1)")
    p.add_argument("--threads", type=int, default=None,
                   help="CPU threads the engine runs with (default: the profile's; fewer: bandwidth as measured "
                        "at that count, compute scaled from the probe's, checked by --check)")
    p.add_argument("--acceptance", help="per-position acceptance: '0.85,0.7,0.59' (P(position i accepted), "
                                        "non-increasing), the LAB ID of a 02_k_sweep run (its measured "
                                        "sweep), or replay:LAB-ID (its replay of the plain runs, every k "
                                        "replayed)")
    p.add_argument("--drafter", default="ngram", choices=["ngram", "mtp", "model"],
                   help="what drafts: ngram (D ~ 0), mtp (the model's nextn layers), model (--draft-model)")
    p.add_argument("--draft-model", help="the draft model's GGUF, for --drafter model")
    p.add_argument("--check", action="store_true",
                   help="measure this box's models (embedded verify(m), SYNTHETIC dense/MoE at two sizes, n-gram "
                        "k=1..3 cells) and compare with the plan; the residual is stored in the profile")
    p.add_argument("--rounds", type=int, default=8, help="--check: verify rounds per model (default 8)")
    p.add_argument("--published", action="store_true",
                   help="plan the seeds' published rows (data/published/) and compare cell by cell")
    return add_json_flag(p)


def _acceptance(text: str | None, drafter: str) -> dict:
    if not text:
        raise LabkitError("--acceptance is required: the planner prices bytes, not how often drafts are accepted",
                          "give per-position values (--acceptance 0.85,0.7,0.59) or a 02_k_sweep LAB ID")
    if text.strip().lower().startswith("replay:"):
        from labkit.provenance import tracking
        from labkit.report import plan_tables

        return plan_tables.acceptance_from_replay(tracking.client(), text.strip()[len("replay:"):].strip("[] "),
                                                  drafter=drafter)
    if text.strip().upper().startswith("LAB:") or text.strip().startswith("[LAB"):
        from labkit.provenance import tracking
        from labkit.report import plan_tables

        return plan_tables.acceptance_from_lab(tracking.client(), text.strip("[] "), drafter=drafter)
    try:
        return {"p": [float(x) for x in text.split(",") if x.strip()], "source": "given"}
    except ValueError:
        raise LabkitError(f"--acceptance {text!r} is neither numbers nor a LAB ID",
                          "write --acceptance 0.85,0.7,0.59, --acceptance LAB:02-… (the measured sweep) or "
                          "--acceptance replay:LAB:02-… (its replay)") from None


def _host_build() -> tuple[dict, dict]:
    from labkit.engines.llamacpp_lib import build_info
    from labkit.provenance.fingerprint import host_info

    return host_info(), build_info()


def _model_path(name: str) -> str:
    from labkit.artifacts import zoo

    if name.endswith(".gguf") or "/" in name:
        return name
    return str(zoo.get(name).path)


def main(argv=None) -> int:
    args = setup_arg_parser().parse_args(argv)
    if args.check:
        from labkit.commands import plan_check

        return plan_check.run(args, rounds=args.rounds)
    if args.published:
        from labkit.commands import plan_check

        return plan_check.published(args)
    if not args.model:
        raise LabkitError("--model is required", "pass --model PATH.gguf (or a zoo name), or use --check/--published")
    import json
    from pathlib import Path

    from labkit.analysis import plan
    from labkit.artifacts.gguf_profile import read_profile
    from labkit.measure import machine
    from labkit.report import plan_tables

    model = read_profile(_model_path(args.model))
    if args.profile.endswith(".json") and Path(args.profile).is_file():
        prof = json.loads(Path(args.profile).read_text())  # named explicitly: whichever host it is from
    else:
        host, build = _host_build()
        prof = machine.load(args.profile, host=host, build=build)
    prof = machine.at_threads(prof, args.threads)
    acc = _acceptance(args.acceptance, args.drafter)
    n_max = int_list(args.n_max, what="--n-max")
    placements = [plan.Placement(g, n) for g in int_list(args.gpu_layers, what="--gpu-layers")
                  for n in int_list(args.n_cpu_moe, what="--n-cpu-moe")]
    draft = read_profile(_model_path(args.draft_model)) if args.draft_model else None
    progress(f"planning {model.architecture} ({len(placements)} placements × n_max {n_max})")
    res = plan.plan(model, prof, placements=placements, n_max=n_max, acceptance=acc["p"],
                    cs=int_list(args.c, what="--c"), drafter=args.drafter, draft=draft)
    summary = {**model.summary(), "warnings": model.warnings, "unclassified": model.unclassified}
    lines = plan_tables.human(res, model=summary, machine=prof)
    if prof.get("derived"):
        lines.append(f"threads: {prof['threads']} ({prof['derived']})")
    output(args, lines, {"predicted": True, "model": summary, "profile": {k: prof.get(k) for k in ("key", "kind", "host", "device",
          "device_note", "overhead_ms", "residual", "threads", "derived")}, "acceptance": acc, **res})
    return 0
