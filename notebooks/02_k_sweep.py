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
# # 02 · k sweep: the n_max protocol, tok/s and acceptance across k, workloads, drafters
#
# First the whole greedy sweep is *predicted*: one plain run per prompt, replayed for every
# k and drafter (with greedy decoding and a deterministic drafter the speculative output is
# the plain output, so the accept pattern at any k follows from the drafter's proposals
# alone), priced with the measured verify(m). Then the recipe's protocol measures:
# `stepwise` (the chapter's n_max protocol) steps k up from 1 per drafter and stops at the
# first step that loses end-to-end (TTLT) against plain, collapses acceptance, or leaves the
# tool suite's noise band; `full` measures every k. Every measured arm, the plain baseline
# and a second plain arm (the A/A control) run on the same prompts, interleaved. Each verdict
# is the geometric-mean speedup with its 95% CI: wins, loses, or no measurable difference
# (within ±margin); undecided steps get more rounds, up to the recipe's budget.

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
protocol = None  # "stepwise" (the n_max protocol) or "full" (every k); None: the recipe's
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
from labkit.measure import protocol as measure_protocol
from labkit.measure import sweep, verify_cost
from labkit.provenance import tracking
from labkit.suites import stepcheck
from labkit.suites.workloads import prompts_for

lab = labkit_lab.start(globals())
R = lab.recipe

# %%
engine = lab.engine()
arms = {d: runtime.make_drafter(d, R, engine) for d in R.drafters}
prompts = prompts_for(engine, R.workloads, limit=R.prompts_per_workload, seed=R.seed)
ver = verify_cost.bench_verify(engine, m_values=range(1, max(R.k) + 2), rounds=16, kv_depth=R.kv_depth, seed=R.seed)
vm = costmodel.fit_verify_model(costmodel.verify_frame(ver))

# %% [markdown]
# ## The sweep predicted before measuring: replay of one plain run per prompt

# %%
pred = measure_protocol.predict(engine, prompts, drafters=arms, ks=R.k, max_tokens=R.max_tokens, V=vm.V, H=vm.H,
                                progress=lab.progress)
lab.table("replay-prediction", pred["per_prompt"], display=False)
print(f"not replayable (measured only): {pred['not_replayable']}")

# %% [markdown]
# ## The protocol

# %%
if R.protocol == "stepwise":
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
from labkit.measure import policy_arm

pol = policy_arm.policy_arms(R, engine, arms, progress=lab.progress)
if pol:
    lab.tags({"policy.verify_source": pol["_verify_source"]})
    prow = sweep.k_sweep(engine, prompts, drafters=arms, ks=[0], policies=pol, runs=R.runs, max_tokens=R.max_tokens,
                         temperatures=(greedy_t,), seed=R.seed, interleave=R.interleave, progress=lab.progress,
                         **lab.arms("policy"))
    lab.table("policy-runs", prow, display=False)
    ptab = lab.table("policy-verdict", verdicts.policy_table(prow, temperature=greedy_t, margin=R.decision_margin,
                                                             confidence=R.decision_confidence))
    lab.tags({"policy.line": "; ".join(ptab["line"]), "policy.llama_server_flags": verdicts.llama_server_flags(ptab)})

# %% [markdown]
# ## The gate at the global default: on vs off

# %%
gated = sweep.gated_sweep(engine, prompts, drafters=arms, default_k=default_k, make_gate=lambda: runtime.make_gate(R),
                          runs=R.runs, max_tokens=R.max_tokens, seed=R.seed, interleave=R.interleave, progress=lab.progress,
                          **lab.arms("gated"))
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
print(f"cost model: the predicted speedup lies inside the measured 95% CI for {inside:.0%} of {len(judged)} "
      "speculative cells; losing cells and their dominant term:")
print(pred_cells[pred_cells["losing_term"].notna()][["drafter", "workload", "k", "losing_term"]].to_string(index=False))
