# ---
# jupyter:
#   jupytext:
#     formats: ipynb,py:percent
#     text_representation:
#       extension: .py
#       format_name: percent
#       format_version: '1.3'
#       jupytext_version: 1.19.6
#   kernelspec:
#     display_name: Python 3 (ipykernel)
#     language: python
#     name: python3
# ---

# %% [markdown]
# # 07 · Concurrency re-bench: speculation at the concurrency you serve
#
# c streams decoded together, k = 0 (plain continuous batching) vs the sweep's best
# n-gram k, at every c: labkit's multi-slot loop (one shared llama.cpp decode per step)
# and llama.cpp's own `llama-server` (`--spec-type ngram-simple`, built from the wheel's
# sources; one process per arm for the whole grid, `-np` the largest c as labkit's loop,
# every slot erased before each arm) on the same prompts. Arms are interleaved; aggregate and per-stream
# tok/s, TTFT/TTLT, acceptance, the batch cost fit, the dip flag, and the verdict at the
# recipe's `production_concurrency`.

# %% tags=["parameters"]
recipe = "default"
concurrency = None  # c values; None: the recipe's (the production concurrency is always added)
production_concurrency = None
k = None  # None means 0 and the best n-gram k of the newest 02_k_sweep, or a recipe's own k list of two or fewer
workload = "edit"
prompts_per_workload = 4
max_tokens = 32
runs = 3  # rounds: each verdict pairs the arms' aggregate tok/s by round, so one round cannot decide
max_runs = 3  # 07 adds no rounds (the sequential budget is 02's): the same as runs
aa_control = None  # the A/A arm at each c (a second plain arm of labkit's loop); None: the recipe's
decision_margin = None
decision_confidence = None
crosscheck_tolerance = None  # labkit's plain arms vs llama-batched-bench (0.10: ±10%); None: the recipe's

# %%
from labkit import lab as labkit_lab
from labkit.analysis import batchcost, costmodel, decide
from labkit.analysis import concurrency as ctable
from labkit.config import runtime
from labkit.measure import concurrency as conc
from labkit.measure import crosscheck, policy_arm, serve
from labkit.provenance import tracking
from labkit.report import rebench
from labkit.suites.workloads import load_workload

lab = labkit_lab.start(globals())
R = lab.recipe
cs = ctable.production_cs(R.concurrency, R.production_concurrency)
spec = rebench.spec_ks(lab.client, R, workload)
ks = [0, *spec["ks"]]
lab.client.set_tag(lab.run_id, "concurrency.k_source", spec["source"])
print(f"c = {cs}, k = {ks} ({spec['source']})")

# %%
skip = lab.skip_if(not conc.has_tokenizer(R), "the model has no tokenizer (SYNTHETIC): the re-bench sends the "
                   "workload's text through labkit and llama-server")

# %%
if not skip:
    ids = conc.tokenize(R, [p.text for p in load_workload(workload, limit=R.prompts_per_workload)])
    per_seq = conc.n_ctx_per_seq(ids, max_tokens=R.max_tokens, ks=ks, n_ctx=R.n_ctx)
    engine = lab.engine(n_seq_max=max(cs), n_ctx=per_seq)
    make_drafter = conc.drafter_factory(R, engine, spec["drafter"])
    pol, pol_source = policy_arm.concurrency_arm(R, engine, make_drafter, progress=lab.progress)  # k: auto
    lab.tags({"policy.verify_source": pol_source})
    bb_rounds = crosscheck.BatchedRounds(runtime.resolve_model(R).path, cs=cs, prompts=ids, max_tokens=R.max_tokens,
                                         threads=R.threads or 2, progress=lab.progress)  # interleaved by round
    res = conc.bench_concurrency(engine, ids, cs=cs, ks=ks, make_drafter=make_drafter, drafter_name=spec["drafter"],
                                 runs=R.runs, max_tokens=R.max_tokens, seed=R.seed, interleave=R.interleave,
                                 progress=lab.progress, control=R.aa_control, policy=pol, after_round=bb_rounds)

# %%
if not skip:
    built = serve.ensure_built(progress=lab.progress)
    tracking.log_json(lab.client, lab.run_id, built, "llama-server-build.json")
    lab.client.set_tag(lab.run_id, "llama_server.commit", built["llama_cpp_commit"])
    sres = serve.bench_serve(built["path"], str(runtime.resolve_model(R).path), ids, cs=cs, ks=ks, spec_type="ngram-simple",
                             threads=R.threads or 2, n_ctx_per_slot=per_seq, runs=R.runs, max_tokens=R.max_tokens,
                             seed=R.seed, interleave=R.interleave, progress=lab.progress, control=R.aa_control)
    conc.server_lossless(engine, ids, res["reference"], sres)

# %%
if not skip:
    df = lab.table("concurrency", ctable.table(res, sres), noise={"agg_tok_s": ["agg_tok_s_min", "agg_tok_s_max"],
                                                                   "key": ["engine", "c", "k"]})
    lab.figure("tok_s_vs_c", decide.without_control(df), name="tok-s-vs-c", title=f"{workload}: throughput vs concurrency")
    dips = lab.table("concurrency-dips", ctable.dips(df))
    lab.client.set_tag(lab.run_id, "concurrency.non_monotonic", str(not dips.empty))

# %% [markdown]
# ## Cross-checks on the same build: llama-batched-bench and llama-server's own counters
#
# labkit's plain arms (aggregate decode tok/s, prefill left out) against
# `llama-batched-bench` at c = 1..4 (same prompt length, tokens, threads and KV layout; one
# call after each of labkit's rounds, so the pairs are interleaved), and
# acceptance by draft position from labkit's step records beside llama-server's own
# `/metrics` counters for the same prompts (two n-gram implementations: side by side).

# %%
if not skip:
    from labkit.analysis import crosscheck as xc

    bb = bb_rounds.result()
    lab.table("batched-bench-runs", bb["rows"], display=False)
    bagree = lab.table("batched-bench-agreement", xc.batched_agreement(df, bb["rows"], tolerance=R.crosscheck_tolerance))
    lab.tags({"crosscheck.batched_bench": xc.summary_batched(bagree),
              "crosscheck.batched_bench_command": " ".join(bb["command"]), "crosscheck.batched_bench_order": bb["order"]})
    lab.table("acceptance-by-position", xc.acceptance_by_position(df))

# %%
if not skip:
    vm = batchcost.fit(res["batch_steps"])
    lab.table("batch-cost-fit", costmodel.fit_table(vm.fit).assign(H_ms=vm.H))
    lab.figure("verify_cost", batchcost.samples(res["batch_steps"]), name="batch-cost", fit=vm.fit.to_dict(),
               H_ms=vm.H, title="verify(rows): the shared decode of c streams")
    pred = lab.table("batch-cost-predictions", batchcost.predict(res["rows"], vm))
    print(f"cost model misses > 10%: {int(pred['miss'].sum())} of {len(pred)} arms")

# %%
if not skip:
    verdict = lab.table("concurrency-verdict", ctable.verdict(df, R.production_concurrency, margin=R.decision_margin,
                                                              confidence=R.decision_confidence))
    v = verdict.iloc[0]
    lab.tags({"concurrency.verdict": v["verdict"], "aa.verdict": v["aa_verdict"], "aa.problem": v["aa_problem"],
              "aa.reliable": None if v["aa_reliable"] is None else str(v["aa_reliable"]).lower()})
    print(v["decision"] or v["verdict"], f"| A/A at c={R.production_concurrency}: {v['aa_verdict']}",
          f"-- box noise: {v['aa_problem']}" if v["aa_problem"] else "")
    forest = lab.table("concurrency-forest", ctable.forest(df, margin=R.decision_margin,
                                                           confidence=R.decision_confidence), display=False)
    lab.metrics(ctable.forest_metrics(forest))  # speedup_c/<engine>.<arm> at step = c, with its CI
    lab.figure("forest", forest, name="concurrency-forest", margin=R.decision_margin,
               title=f"{workload}: aggregate speedup vs plain at each c, with its CI")
