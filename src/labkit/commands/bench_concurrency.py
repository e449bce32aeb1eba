"""``labkit bench concurrency|serve``: speculation re-benched at c concurrent streams.

concurrency: labkit's multi-slot loop (continuous batching on one llama.cpp context),
             per c and k: aggregate and per-stream tok/s, TTFT/TTLT p50/p95, acceptance,
             rows per shared decode, speedup vs k = 0 at the same c, lossless per stream;
             the batch cost fit and its predictions; the dip flag.
serve:       llama.cpp's own llama-server (built from the wheel's sources on first use),
             c streaming clients, speculation off vs on at each c, its own acceptance.

Each arm's verdict is its aggregate tok/s over plain's at the same c, paired by round, with
its CI (``analysis.concurrency.forest``, through ``analysis.decide``): the JSON's "verdicts".
"""

from __future__ import annotations

from labkit.analysis import batchcost, decide
from labkit.analysis import concurrency as ctable
from labkit.commands import emit, progress
from labkit.errors import LabkitError

CONCURRENCY_DRAFTERS = ("ngram",)  # one drafter per stream; model/MTP drafters would need an engine each


def add_parsers(sub, common) -> None:
    """The two subcommands, on ``labkit bench``'s subparsers."""
    for name, text in (("concurrency", "labkit's multi-slot loop at c concurrent streams"),
                       ("serve", "llama-server at c concurrent streaming clients")):
        p = sub.add_parser(name, parents=[common], help=text)
        p.add_argument("--c", default=None, help='concurrent streams, e.g. "1,2,3,4" (default: recipe concurrency)')
        p.add_argument("--k", default="0,3", help='draft lengths, 0 = plain (default "0,3")')
        p.add_argument("--workload", default="edit", help="a workload under data/workloads (default edit)")
        p.add_argument("--prompts", type=int, default=None,
                       help="distinct prompts of the workload (default: recipe prompts_per_workload)")
        p.add_argument("--requests", type=int, default=None,
                       help="requests per run, cycling through the prompts (default: max(c, prompts))")
        p.add_argument("--max-tokens", type=int, default=None)
        p.add_argument("--runs", type=int, default=1, help="interleaved rounds over all (c, k) arms (default 1)")
        p.add_argument("--no-kv-unified", dest="kv_unified", action="store_false",
                       help="one KV stream per slot instead of one unified KV buffer (llama-server's -np default)")
        if name == "concurrency":
            p.add_argument("--drafter", default="ngram", choices=CONCURRENCY_DRAFTERS)
            p.add_argument("--no-lossless", action="store_true", help="skip the per-stream lossless check")
        else:
            p.add_argument("--spec-type", default="ngram-simple",
                           choices=("ngram-simple", "ngram-cache", "draft-simple", "draft-mtp"))
            p.add_argument("--draft-model", default=None, help="draft model for --spec-type draft-simple")
            p.add_argument("--deadline", type=float, default=600.0, help="seconds per arm at most (default 600)")


def parse_args(args, recipe, parse_int_list) -> dict:
    """Check every flag before any model loads."""
    from labkit.suites.workloads import load_workload

    cs = parse_int_list(args.c) if args.c else list(recipe.concurrency)
    ks = parse_int_list(args.k)
    if not cs or min(cs) < 1:
        raise LabkitError(f"--c {args.c}: concurrency must be >= 1", 'use e.g. --c 1,2,3,4')
    if max(cs) > 64:
        raise LabkitError(f"--c {args.c}: at most 64 streams", "use c <= 64")
    if not ks or min(ks) < 0:
        raise LabkitError(f"--k {args.k}: draft lengths must be >= 0", 'use e.g. --k 0,3')
    if args.runs < 1:
        raise LabkitError(f"--runs {args.runs}", "use --runs >= 1")
    n_prompts = args.prompts or recipe.prompts_per_workload
    if n_prompts < 1:
        raise LabkitError(f"--prompts {n_prompts}", "use --prompts >= 1")
    if args.requests is not None and args.requests < 1:
        raise LabkitError(f"--requests {args.requests}", "use --requests >= 1")
    prompts = load_workload(args.workload, limit=n_prompts)
    return {"cs": cs, "ks": ks, "prompts": prompts, "max_tokens": args.max_tokens or recipe.max_tokens}


def run_concurrency(args, recipe, opts) -> dict:
    from labkit.config import runtime
    from labkit.measure import concurrency

    ids = concurrency.tokenize(recipe, [p.text for p in opts["prompts"]])
    per = concurrency.n_ctx_per_seq(ids, max_tokens=opts["max_tokens"], ks=opts["ks"], n_ctx=recipe.n_ctx)
    progress(f"loading {recipe.model} with {max(opts['cs'])} sequences of {per} positions")
    engine = runtime.open_engine(recipe, n_seq_max=max(opts["cs"]), n_ctx=per, kv_unified=args.kv_unified)
    try:
        res = concurrency.bench_concurrency(
            engine, ids, cs=opts["cs"], ks=opts["ks"], drafter_name=args.drafter,
            make_drafter=concurrency.drafter_factory(recipe, engine, args.drafter), runs=args.runs,
            n_requests=args.requests, max_tokens=opts["max_tokens"], seed=recipe.seed,
            interleave=recipe.interleave, check_lossless=not args.no_lossless, progress=progress)
        res["engine_describe"] = engine.describe()
    finally:
        engine.close()
    df = ctable.table(res)
    res["dips"] = ctable.dips(df).to_dict("records")
    res["non_monotonic"] = bool(res["dips"])
    try:
        vm = batchcost.fit(res["batch_steps"])
        res["batch_fit"] = batchcost.fit_summary(vm)
        pred = batchcost.predict(res["rows"], vm)
        res["predictions"] = pred.to_dict("records")
        res["prediction_misses"] = [r for r in res["predictions"] if r["miss"]]
    except ValueError as e:
        res["batch_fit"] = {"skipped": str(e)}
    res["workload"] = args.workload
    res["verdicts"] = verdicts(df, recipe)
    return res


def run_serve(args, recipe, opts) -> dict:
    from labkit.artifacts import server_build
    from labkit.config import runtime
    from labkit.measure import concurrency, serve

    info = server_build.build(progress=progress)  # cached after the first time
    model = runtime.resolve_model(recipe)
    draft = runtime.resolve_model(recipe, draft=True).path if args.spec_type == "draft-simple" else None
    ids = concurrency.tokenize(recipe, [p.text for p in opts["prompts"]])
    per = concurrency.n_ctx_per_seq(ids, max_tokens=opts["max_tokens"], ks=opts["ks"], n_ctx=recipe.n_ctx)
    try:
        res = serve.bench_serve(info["path"], str(model.path), ids, cs=opts["cs"], ks=opts["ks"],
                                spec_type=args.spec_type, draft_model=str(draft) if draft else None,
                                threads=recipe.threads or 2, n_ctx_per_slot=per, runs=args.runs,
                                n_requests=args.requests, max_tokens=opts["max_tokens"], seed=recipe.seed,
                                interleave=recipe.interleave, deadline_s=args.deadline, kv_unified=args.kv_unified,
                                progress=progress)
    except serve.ServerError as e:  # keep what was measured: the JSON (with --json) or a note, then the error
        if not args.json:
            progress(f"llama-server failed at {e.arm}; {len(e.partial)} arm(s) finished: --json keeps them")
            raise
        emit({"kind": "serve", "error": e.problem, "failed_arm": e.arm, "finished_arms": e.partial,
              "kept_requests": [{k: v for k, v in x.items() if k != "tokens"} for x in e.kept]})
        raise
    res["server_build"] = info
    res["model"] = model.describe()
    res["workload"] = args.workload
    df = ctable.table(res)
    res["dips"] = ctable.dips(df).to_dict("records")
    res["non_monotonic"] = bool(res["dips"])
    res["verdicts"] = verdicts(df, recipe)
    return res


UNIT = "end-to-end aggregate tok/s"  # every request's tokens over the round's wall time, prefill included


def verdicts(df, recipe) -> list[dict]:
    """Each speculative arm (and the A/A control) over plain at the same c: the paired ratio
    by round, its CI and verdict (``ctable.forest``), the unit and number of pairs said."""
    f = ctable.forest(df, margin=recipe.decision_margin, confidence=recipe.decision_confidence)
    out = []
    for r in f.to_dict("records"):
        est = decide.Estimate(ratio=r["ratio"], lo=r["lo"], hi=r["hi"], verdict=r["verdict"],
                              confidence=r["confidence"], level=r["confidence"], margin=recipe.decision_margin,
                              n_prompts=r["rounds"], n_pairs=r["rounds"])
        out.append({**r, "unit": UNIT, "pairs": r["rounds"],
                    "line": est.line(r["label"]) + f"; {r['rounds']} round pair{'s' if r['rounds'] != 1 else ''}"})
    return out


def human(res) -> list[str]:
    """The verdict lines first, then the per-c table, the dips and the lossless check."""
    cols = ["engine", "c", "k", "agg_tok_s", "per_stream_tok_s", "ttft_p50_ms", "ttlt_p50_ms", "acceptance",
            "rows_per_step", "speedup", "lossless"]
    df = ctable.table(res)
    lines = [f"{res.get('kind')} on workload {res.get('workload')}, {res.get('runs')} round(s); ratios are {UNIT}, "
             "paired by round:"]
    lines += [f"  {v['line']}" for v in res.get("verdicts") or []] or ["  no speculative arm measured (--k 0 only)"]
    lines += ["per-c table (medians over rounds):"]
    lines += ["  " + t for t in df[cols].to_string(index=False, float_format=lambda x: f"{x:.2f}").splitlines()]
    for d in res.get("dips") or []:
        lines.append(f"dip: {d['engine']} k={d['k']} aggregate falls c={d['c_from']}→{d['c_to']} "
                     f"({d['drop']:.0%}, {'beyond' if d['beyond_noise'] else 'within'} the run-to-run range)")
    lines.append("--json for every number (per-stream TTFT/TTLT p95, the batch cost fit, predictions)")
    return lines
