"""``labkit bench verify|spec|concurrency|serve``: the measurements everything else is built from.

verify:      verify(m) per m (median, range, all samples) and the plain step H, at a KV depth.
spec:        plain vs speculative generation of one prompt: tok/s, speedup, acceptance by
             position, mean accepted length, lossless check, gate events.
concurrency: labkit's multi-slot loop at c concurrent streams, k = 0 vs k, per c (see
             ``labkit bench concurrency --help``).
serve:       llama.cpp's own llama-server at c concurrent streaming clients, spec off vs on.
"""

from __future__ import annotations

import argparse

from labkit import engines
from labkit.commands import add_json_flag, bench_concurrency, output, progress
from labkit.config import runtime
from labkit.config.recipe import load, resolve
from labkit.decoding import drafters
from labkit.errors import LabkitError
from labkit.measure import spec_vs_plain, verify_cost
from labkit.provenance import fingerprint


def parse_int_list(text: str) -> list[int]:
    """``"1-8"``, ``"1,2,4"`` or ``"0-2,4"`` to a list of ints."""
    out: list[int] = []
    try:
        for part in text.split(","):
            if "-" in part.strip()[1:]:
                lo, hi = part.split("-", 1)
                out.extend(range(int(lo), int(hi) + 1))
            else:
                out.append(int(part))
    except ValueError as e:
        raise LabkitError(f"cannot read {text!r} as a list of integers", 'use e.g. "1-8" or "1,2,4"') from e
    return out


def parse_k(text: str) -> int | str:
    """``--k``: a draft length, or ``auto`` (the recipe's draft length policy, else ``priced``)."""
    if text.strip().lower() == "auto":
        return "auto"
    try:
        return int(text)
    except ValueError as e:
        raise argparse.ArgumentTypeError(f"{text!r} is neither a draft length nor 'auto'") from e


def setup_arg_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="labkit bench", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="what", required=True)
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--recipe", default=None, help="experiments/<name>.yaml or a path (default: default)")
    common.add_argument("--model", default=None, help="override the recipe's model (zoo name or .gguf path)")
    common.add_argument("--engine", default=None, choices=sorted(engines.ENGINES), help="override the engine")
    common.add_argument("--threads", type=int, default=None, help="override the recipe's thread count")
    add_json_flag(common)
    v = sub.add_parser("verify", parents=[common], help="verify(m) cost sweep")
    v.add_argument("--m", default=None, help='row counts, e.g. "1-8" (default: recipe verify_m)')
    v.add_argument("--rounds", type=int, default=None, help="rounds over all m (default: recipe verify_rounds)")
    v.add_argument("--kv-depth", type=int, default=None, help="KV cache depth (default: recipe kv_depth)")
    s = sub.add_parser("spec", parents=[common], help="speculative vs plain generation")
    src = s.add_mutually_exclusive_group(required=True)
    src.add_argument("--workload", help="a workload under data/workloads (edit, prose_en, ...)")
    src.add_argument("--prompt-file", help="a text file holding one prompt")
    s.add_argument("--prompt-index", type=int, default=0, help="which prompt of the workload (default 0)")
    s.add_argument("--k", type=parse_k, required=True,
                   help="draft length, or auto: a policy chooses it per step (recipe policy, else priced)")
    s.add_argument("--k-max", type=int, default=None,
                   help="with --k auto: the longest draft the policy may choose (default: recipe policy_k_max)")
    s.add_argument("--verify-json", default=None,
                   help="with --k auto: this box's `labkit bench verify --json` output to price with (default: the recipe's "
                        "policy_verify: measure it first, or error)")
    s.add_argument("--drafter", default="ngram", choices=drafters.names())
    s.add_argument("--draft-model", default=None, help="draft model for --drafter model (zoo name or path)")
    s.add_argument("--gate", type=float, default=None,
                   help="acceptance gate threshold (default: $AS_SPEC_MIN_ACCEPT, else the recipe's, 0.60); 0 = off")
    s.add_argument("--max-tokens", type=int, default=None)
    s.add_argument("--runs", type=int, default=None, help="measured pairs after the cold pair (default: recipe runs)")
    s.add_argument("--temperature", type=float, default=0.0)
    s.add_argument("--seed", type=int, default=None)
    s.add_argument("--records", action="store_true", help="include every step record in the JSON")
    bench_concurrency.add_parsers(sub, common)
    return p


def _recipe(args):
    """The recipe with the environment and this command's flags applied, each recorded
    as its field's origin (a bad value is blamed on the flag that set it)."""
    r = load(args.recipe)
    over = {}
    if args.model:
        over.update(model=args.model, model_sha256=None)
    if getattr(args, "draft_model", None):
        over.update(draft_model=args.draft_model, draft_model_sha256=None)
    over.update(engine=args.engine, threads=args.threads, gate=getattr(args, "gate", None),
                policy_k_max=getattr(args, "k_max", None))
    flags = {"model_sha256": "--model", "draft_model_sha256": "--draft-model", "draft_model": "--draft-model",
             "policy_k_max": "--k-max"}
    r = resolve(r, {k: v for k, v in over.items() if v is not None})
    r.origins.update({k: flags.get(k, "--" + k.replace("_", "-")) for k in over if over[k] is not None})
    for k in ("model_sha256", "draft_model_sha256"):
        if k in over:
            setattr(r, k, None)
            r.origins[k] = flags[k]
    return r


def _prompt(args):
    """Check the spec arguments before any model loads."""
    from labkit.suites.workloads import load_prompt_file, load_workload

    if args.k == "auto":
        pass
    elif args.k < 0:
        raise LabkitError(f"--k {args.k} is negative", "use k >= 0 (0 measures plain decoding only)")
    if args.workload:
        prompts = load_workload(args.workload)
        if not 0 <= args.prompt_index < len(prompts):
            raise LabkitError(f"--prompt-index {args.prompt_index} is out of range",
                              f"workload {args.workload} has {len(prompts)} prompts (0..{len(prompts) - 1})")
        return prompts[args.prompt_index]
    return load_prompt_file(args.prompt_file)


def main(argv=None) -> int:
    args = setup_arg_parser().parse_args(argv)
    recipe = _recipe(args)
    if args.what in ("concurrency", "serve"):
        opts = bench_concurrency.parse_args(args, recipe, parse_int_list)
        run = bench_concurrency.run_concurrency if args.what == "concurrency" else bench_concurrency.run_serve
        res = run(args, recipe, opts)
        res["provenance"] = fingerprint.collect(recipe=recipe)
        output(args, lambda: bench_concurrency.human(res), res)
        return 0
    prompt = _prompt(args) if args.what == "spec" else None
    progress(f"loading {recipe.model} on {recipe.engine}")
    names = [args.drafter] if args.what == "spec" and (args.k == "auto" or args.k > 0) else []
    with runtime.open_target(recipe, drafter_names=names) as engine:
        if args.what == "verify":
            res = verify_cost.bench_verify(
                engine,
                m_values=parse_int_list(args.m) if args.m else recipe.verify_m,
                rounds=args.rounds or recipe.verify_rounds,
                kv_depth=args.kv_depth or recipe.kv_depth,
                seed=recipe.seed,
                progress=progress,
            )
        else:
            res = _spec(args, recipe, engine, prompt)
        res["provenance"] = fingerprint.collect(recipe=recipe, engine=engine)
    output(args, lambda: (verify_lines if args.what == "verify" else spec_lines)(res), res)
    return 0


def _host(res) -> str:
    """Where it was measured (ratios compare only within one run: FACTS.md), and where the rest is."""
    prov = res.get("provenance") or {}
    host, eng = prov.get("host") or {}, prov.get("engine") or {}
    threads = f", {eng['threads']} threads" if eng.get("threads") else ""
    return f"  host {host.get('label') or host.get('hostname')} ({host.get('cpu')}){threads}; --json for every number"


def verify_lines(res) -> list[str]:
    """verify(m) in a few lines: H, then each m as a multiple of H (median, range)."""
    h = (res.get("H_ms") or {}).get("median")
    lines = [f"verify(m) at KV depth {res['kv_depth']}, {res['rounds']} rounds (median, range):"
             + (f" plain step H = {h:.2f} ms" if h else "")]
    for r in res["verify"]:
        rel = f" = {r['median'] / h:.2f} H" if h else ""
        lines.append(f"  m={r['m']}: {r['median']:.2f} ms ({r['min']:.2f}–{r['max']:.2f}){rel}")
    return [*lines, _host(res)]


def spec_lines(res) -> list[str]:
    """The verdict (paired, with its CI), then the arms' tok/s, acceptance and the lossless check."""
    b, s = res["baseline"], res["speculative"]
    d = (res.get("drafter") or {}).get("name") or "plain"
    p = res.get("prompt") or {}
    lossless = {True: "lossless (same tokens as plain)", False: "NOT lossless: see divergences in --json",
                None: "sampled: lossless not checked per run"}[res.get("lossless")]
    acc = res.get("acceptance")
    return [
        f"{d} vs plain on {p.get('workload') or p.get('source')} prompt {p.get('id')}: {res['decision']['line']}",
        f"  {res['decision_e2e']['line']}",
        f"  decode tok/s: plain {b['decode_tok_s']['median']:.1f}, speculative {s['decode_tok_s']['median']:.1f} "
        f"(medians of {res['runs']} warm runs; the cold pair apart)",
        f"  acceptance {acc:.0%} per drafted token, {res['tokens_per_step']:.2f} tokens per step; {lossless}"
        if acc is not None else f"  nothing drafted; {lossless}",
        _host(res),
    ]


def _spec(args, recipe, engine, prompt) -> dict:
    ids = engine.tokenize(prompt.text)
    max_tokens = args.max_tokens or recipe.max_tokens
    auto = args.k == "auto"
    k = recipe.policy_k_max if auto else args.k
    engine.check_fits(len(ids) + max_tokens + k, what=f"prompt {prompt.id} ({len(ids)} tokens) + max_tokens")
    drafter = runtime.make_drafter(args.drafter, recipe, engine) if k > 0 else None
    pol, verify_source = None, None
    try:
        if auto:
            vm, verify_source = policy_verify_model(args, recipe, engine)
            pol = runtime.make_policy(recipe, drafter, verify=vm)
        res = spec_vs_plain.bench_spec(
            engine, ids, drafter=drafter, k=k, runs=args.runs or recipe.runs, max_tokens=max_tokens,
            temperature=args.temperature, seed=recipe.seed if args.seed is None else args.seed,
            make_gate=(lambda: None) if auto else (lambda: runtime.make_gate(recipe)),
            keep_records=args.records, progress=progress, policy=pol,
            margin=recipe.decision_margin, confidence=recipe.decision_confidence,
        )
    finally:
        if drafter is not None:
            drafter.close()
    if pol is not None:
        res["policy"] = {**pol.describe(), "verify_source": verify_source, "learned": pol.table(),
                         "recalibration": pol.recalibration()}
    res["prompt"] = {"id": prompt.id, "workload": prompt.workload, "source": prompt.source}
    res["gate"] = {"threshold": recipe.gate, "source": recipe.origin_of("gate"), "window": recipe.gate_window,
                   "probe_every": recipe.gate_probe_every}
    return res


def policy_verify_model(args, recipe, engine):
    """This host and build's verify(m) model for ``--k auto``, and where it came from:
    ``--verify-json`` (a `labkit bench verify` result of the same host and engine build),
    else measured now (recipe ``policy_verify: measure``), else a LabkitError."""
    import json
    from pathlib import Path

    from labkit.analysis import costmodel

    need = recipe.policy_k_max + 1
    if args.verify_json:
        p = Path(args.verify_json)
        try:
            res = json.loads(p.read_text().strip().splitlines()[-1])
        except (OSError, ValueError, IndexError) as e:
            raise LabkitError(f"--verify-json {p}: cannot read a `labkit bench verify` result ({e})",
                              "pass what `labkit bench verify --m 1-9 --json` printed on this box") from e
        prov = res.get("provenance") or {}
        here = fingerprint.host_info().get("hostname"), engine.describe().get("build")
        there = (prov.get("host") or {}).get("hostname"), (prov.get("engine") or {}).get("build")
        if res.get("kind") != "verify" or there != here:
            raise LabkitError(f"--verify-json {p} is not a verify(m) fit of this host and build "
                              f"(it has {there}, this is {here})",
                              "measure it here: `labkit bench verify --m 1-9 --json > verify.json`, or drop --verify-json "
                              "to measure before decoding (policy_verify: measure)")
        return costmodel.fit_verify_model(costmodel.verify_frame(res)), f"{p} (labkit bench verify)"
    if recipe.policy_verify != "measure":
        raise LabkitError(f"--k auto has no verify(m) model for this host and build (policy_verify: "
                          f"{recipe.policy_verify})", "pass --verify-json with `labkit bench verify --json --m "
                          f"1-{need}` on this box, or set policy_verify: measure in the recipe")
    progress(f"k auto: measuring verify(m) for m = 1..{need} ({recipe.policy_verify_rounds} rounds)")
    res = verify_cost.bench_verify(engine, m_values=range(1, need + 1), rounds=recipe.policy_verify_rounds,
                                   kv_depth=recipe.kv_depth, seed=recipe.seed)
    return (costmodel.fit_verify_model(costmodel.verify_frame(res)),
            f"measured now: m 1..{need}, {recipe.policy_verify_rounds} rounds at KV depth {recipe.kv_depth}")
