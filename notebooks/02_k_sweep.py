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
#     display_name: labkit (.venv)
#     language: python
#     name: labkit
# ---

# %% [markdown]
# # 02 · k sweep: the search, the n_max ladder, tok/s and acceptance across k, workloads, drafters
#
# First the whole greedy sweep is *predicted*: one plain run per prompt, replayed for every
# k and drafter (with greedy decoding and a deterministic drafter the speculative output is
# the plain output, so the accept pattern at any k follows from the drafter's proposals
# alone), priced with the measured verify(m). Then the recipe's protocol measures:
# `search` (the default) splits each workload's prompts into choosing and held-out ones,
# ranks every (drafter, k) per workload by the replay, measures the best-ranked ones and
# `k: auto` against plain, decides per workload, and checks each decision on the held-out
# prompts; it keeps the chapter's ladder as a record (its first rung, measured in the same
# rounds). `stepwise` (the chapter's n_max ladder alone) steps k up from 1 per drafter and
# stops at the first step that loses end-to-end (TTLT), collapses acceptance, or leaves the
# tool suite's noise band; `full` measures every k. Every measured arm, the plain baseline
# and a second plain arm (the A/A control) run on the same prompts, interleaved. Each verdict
# is the geometric-mean speedup with its 95% CI (corrected for the candidates and the
# looks): wins, loses, or no measurable difference (within ±margin); undecided verdicts get
# more rounds, up to the recipe's budget.

# %% tags=["parameters"]
recipe = "default"
k = None  # draft lengths; None: the recipe's
workloads = None
drafters = None
runs = None
max_tokens = None
prompts_per_workload = None
temperatures = None
gate = None  # threshold for the gate-on comparison at the global default k
protocol = None  # "search" (rank, decide per workload, check), "stepwise" (the n_max ladder) or "full"; None: the recipe's
search_candidates = None  # the best-ranked fixed settings measured per workload, beside k auto
check_share = None  # the share of each workload's prompts held out to check the decision
reserve_prompts = None  # fresh prompts per workload for the rounds after the first (0: repeat the same ones)
traffic_mix = None  # workload -> share of the tokens, for the mix line (None: equal)
policy_k_max = None  # the longest draft k auto may choose
decision_margin = None  # the ±band that counts as no measurable difference (0.02: ±2%)
decision_confidence = None  # the CI level (0.95)
aa_control = None  # the A/A arm: a second plain arm (true by default; off only with protocol "full")
max_runs = None  # rounds a step may add while its verdict is undecided
budget_s = None  # seconds of measuring per protocol step (None: no time limit)

# %%
from labkit import lab as labkit_lab
from labkit.analysis import costmodel, replay, sweep_tables, verdicts
from labkit.analysis import protocol as decide
from labkit.config import runtime
from labkit.lab.record import record_search
from labkit.analysis import search
from labkit.measure import policy_arm, sweep, verify_cost
from labkit.measure import protocol as measure_protocol
from labkit.measure import search as measure_search
from labkit.provenance import tracking
from labkit.suites import stepcheck
from labkit.suites.workloads import prompts_for, reserve_for

lab = labkit_lab.start(globals())
R = lab.recipe

# %%
engine = lab.engine()
arms = {d: runtime.make_drafter(d, R, engine) for d in R.drafters}
prompts = prompts_for(engine, R.workloads, limit=R.prompts_per_workload, seed=R.seed)
# the search chooses on some prompts and checks on the others (seeded, split before measuring)
choose, held_out = search.split(prompts, check_share=R.check_share, seed=R.seed) if R.protocol == "search" \
    else (prompts, [])
# fresh choosing prompts for the rounds after the first, for the workloads still undecided (not replayed)
reserve = reserve_for(engine, R.workloads, after=R.prompts_per_workload, n=R.reserve_prompts, seed=R.seed) \
    if R.protocol == "search" else []
auto = "priced" if R.protocol == "search" and R.search_auto and not R.policy else None  # k auto, a candidate
m_max = max(max(R.k) + 1, R.policy_k_max + 1 if (R.policy or auto) else 0)  # k auto prices drafts up to k_max
ver = verify_cost.bench_verify(engine, m_values=range(1, m_max + 1), rounds=16, kv_depth=R.kv_depth, seed=R.seed)
vm = costmodel.fit_verify_model(costmodel.verify_frame(ver))

# %% [markdown]
# ## The sweep predicted before measuring: replay of one plain run per prompt

# %%
replay_of = measure_search.predict if R.protocol == "search" else measure_protocol.predict  # the search prunes
pred = replay_of(engine, choose, drafters=arms, ks=R.k, max_tokens=R.max_tokens, V=vm.V, H=vm.H, progress=lab.progress)
lab.table("replay-prediction", pred["per_prompt"], display=False)
if pred["not_replayable"]:  # a drafter the search left out unreplayed is named as it does so, with why
    print(f"not replayable (measured only): {', '.join(map(str, pred['not_replayable']))}")

# %% [markdown]
# ## The protocol

# %%
pol = policy_arm.policy_arms(R, engine, arms, progress=lab.progress, policy=auto,
                             verify=(vm, f"02's own verify(m): m 1..{m_max}, 16 rounds at KV depth {R.kv_depth}"))

# %%
if R.protocol == "search":
    res = measure_search.from_recipe(R, engine, prompts, drafters=arms, vm=vm, predicted=pred, policies=pol,
                                     reserve=reserve, progress=lab.progress, **lab.arms("sweep"))
    rows, prow = search.split_policy_rows(res["rows"])
    record_search(lab, res)
    print(search.text(res))
elif R.protocol == "stepwise":
    suite = stepcheck.SuiteCheck.from_recipe(engine, arms, R, progress=lab.progress)
    res = measure_protocol.stepwise(engine, prompts, drafters=arms, ks=R.k, thresholds=decide.Thresholds.from_recipe(R),
                                    runs=R.runs, max_tokens=R.max_tokens, temperatures=tuple(R.temperatures),
                                    seed=R.seed, interleave=R.interleave, suite_check=suite,
                                    residency=engine.describe().get("residency"), predicted=pred["by_k"],
                                    progress=lab.progress, max_runs=R.max_runs, budget_s=R.budget_s,
                                    control=R.aa_control, **lab.arms("sweep"))
    rows = res["rows"]
    lab.table("protocol-steps", res["steps"], display=False)
    print(verdicts.steps_text(res["steps"]))
    winner = decide.winner_tag(res["winner"], source=str(lab.id.child("protocol-steps")))
    lab.client.set_tag(lab.run_id, "protocol.winner", winner)
    lab.client.set_tag(lab.run_id, "protocol.stopped", res["stopped"][:5000])
    print(f"protocol winner: {winner}\nstopped: {res['stopped']}")
else:
    rows = sweep.k_sweep(engine, prompts, drafters=arms, ks=R.k, runs=R.runs, max_tokens=R.max_tokens,
                         temperatures=tuple(R.temperatures), seed=R.seed, interleave=R.interleave, progress=lab.progress,
                         control=R.aa_control, **lab.arms("sweep"))

# %%
lab.table("sweep-runs", rows, display=False)
aa = verdicts.aa_tags(rows, temperature=measure_protocol.decision_temperature(R.temperatures),
                      margin=R.decision_margin, confidence=R.decision_confidence)
lab.tags(aa)
print(aa.get('aa.line', 'A/A control (plain vs plain): not measured (aa_control: false)'))

# %%
greedy_t = measure_protocol.decision_temperature(R.temperatures)
beside = replay.beside_measured(pred["by_k"], rows, temperature=greedy_t) if not pred["by_k"].empty else None
if beside is not None:
    lab.table("predicted-beside-measured", beside)
    lab.figure("replay_vs_measured", beside, name="replay-vs-measured")

# %%
cells = sweep_tables.cell_table(rows, margin=R.decision_margin, confidence=R.decision_confidence)
lab.metrics(sweep_tables.cell_metrics(cells, rows=rows, margin=R.decision_margin, confidence=R.decision_confidence))
lab.table("sweep-cells", cells, noise={"tok_s": ["tok_s_min", "tok_s_max"],
                                       "key": ["drafter", "workload", "k", "temperature"]})

# %%
greedy = cells[cells["temperature"] == 0]
lab.figure("tok_s_vs_k", greedy, name="tok-s-vs-k", noise={"tok_s": ["tok_s_min", "tok_s_max"]})
lab.figure("speedup_heatmap", greedy, name="speedup-heatmap")
best = sweep_tables.best_k(cells, rows=rows, margin=R.decision_margin, confidence=R.decision_confidence)
lab.table("best-k", best)
default_k = sweep_tables.global_default(cells, rows=rows, margin=R.decision_margin, confidence=R.decision_confidence)
lab.table("global-default", default_k)
forest = verdicts.forest_table(rows, margin=R.decision_margin, confidence=R.decision_confidence,
                               temperature=greedy_t)
lab.table("speedup-forest", forest, display=False)
lab.figure("forest", forest, name="speedup-forest", margin=R.decision_margin)

# %% [markdown]
# ## `k: auto`: the draft length priced per step (when the recipe asks for it)
#
# The policy chooses each step's draft length from the drafter's evidence and this box's own
# verify(m), measured first. Its arm runs beside plain on the same prompts, and is judged
# like every fixed k: a paired ratio with its CI.

# %%
if pol and R.protocol != "search":  # the search measured k auto per workload already
    prow = sweep.k_sweep(engine, prompts, drafters=arms, ks=[0], policies=pol, runs=R.runs, max_tokens=R.max_tokens,
                         temperatures=(greedy_t,), seed=R.seed, interleave=R.interleave, progress=lab.progress,
                         **lab.arms("policy"))
if pol and len(prow):
    lab.tags({"policy.verify_source": pol["_verify_source"]})
    lab.table("policy-runs", prow, display=False)
    ptab = lab.table("policy-verdict", verdicts.policy_table(prow, temperature=greedy_t, margin=R.decision_margin,
                                                             confidence=R.decision_confidence))
    lab.tags({"policy.line": "; ".join(ptab["line"]), "policy.llama_server_flags": verdicts.llama_server_flags(ptab)})

# %% [markdown]
# ## The gate at the global default: on vs off
#
# Not in the search, which decides per workload with the gate off (the gate is a per-drafted-token
# rule that held k=5 to ~1.2 tokens per step on edit).

# %%
if R.protocol != "search":
    gated = sweep.gated_sweep(engine, prompts, drafters=arms, default_k=default_k, make_gate=lambda: runtime.make_gate(R),
                              runs=R.runs, max_tokens=R.max_tokens, seed=R.seed, interleave=R.interleave,
                              progress=lab.progress, **lab.arms("gated"))
    if gated is not None:
        lab.table("gate-on-vs-off", sweep_tables.gate_comparison(cells, sweep_tables.cell_table(gated)))

# %% [markdown]
# ## Latency, repetition, and the cost model

# %%
lab.table("latency", sweep_tables.latency_table(rows))
rep = sweep_tables.repetition_table(rows)
if not rep.empty:
    lab.figure("acceptance_vs_repetition", rep, name="acceptance-vs-repetition")

# %%
pred_cells = costmodel.predict(cells, rows, vm, residency=engine.describe().get("residency"))
lab.table("cost-model", pred_cells)
judged = pred_cells[pred_cells["inside_ci"].notna()]
inside = float(judged["inside_ci"].astype(bool).mean()) if len(judged) else float("nan")
lab.metric("costmodel/inside_ci", inside)
lab.figure("predicted_vs_measured", pred_cells[pred_cells["temperature"] == 0], name="predicted-vs-measured")
losing = [f"  {r.drafter} k={r.k} on {r.workload} at T={r.temperature:g}: {r.losing_term}"
          for r in pred_cells[pred_cells["losing_term"].notna()].itertuples()]
print(f"cost model: the predicted speedup lies inside the measured 95% CI for {inside:.0%} of {len(judged)} "
      "speculative cells; " + ("\n".join(["cells predicted to lose, and why:", *losing]) if losing
                               else "no cell predicted to lose"))
