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
# # 02 · k sweep: tok/s and acceptance for k = 0..6 across workloads
#
# Every (drafter, k) arm and the plain baseline run on the same prompts, interleaved in
# random order within each run; ≥ 3 warm runs per cell, reported as median and range.
# Speedup pairs each speculative run with the plain run of the same prompt and run.
# The cost model then predicts every cell from verify(m), D(k) and the acceptance
# profile, and names the inequality term behind each losing cell.

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

# %%
from labkit import lab as labkit_lab
from labkit.analysis import costmodel, sweep_tables
from labkit.config import runtime
from labkit.measure import sweep, verify_cost
from labkit.suites.workloads import load_workload

lab = labkit_lab.start(globals())
R = lab.recipe

# %%
engine = lab.engine()
arms = {d: runtime.make_drafter(d, R, engine) for d in R.drafters}
prompts = [p for w in R.workloads for p in load_workload(w, limit=R.prompts_per_workload)]
rows = sweep.k_sweep(engine, prompts, drafters=arms, ks=R.k, runs=R.runs, max_tokens=R.max_tokens,
                     temperatures=tuple(R.temperatures), seed=R.seed, interleave=R.interleave, progress=print,
                     **lab.arms("sweep"))
lab.table("sweep-runs", rows, display=False)

# %%
cells = sweep_tables.cell_table(rows)
lab.metrics(sweep_tables.cell_metrics(cells))
lab.table("sweep-cells", cells, noise={"tok_s": ["tok_s_min", "tok_s_max"],
                                       "key": ["drafter", "workload", "k", "temperature"]})

# %%
greedy = cells[cells["temperature"] == 0]
lab.figure("tok_s_vs_k", greedy, name="tok-s-vs-k", noise={"tok_s": ["tok_s_min", "tok_s_max"]})
lab.figure("speedup_heatmap", greedy, name="speedup-heatmap")
best = sweep_tables.best_k(cells)
lab.table("best-k", best)
default_k = sweep_tables.global_default(cells)
lab.table("global-default", default_k)

# %% [markdown]
# ## The gate at the global default: on vs off

# %%
gated = sweep.gated_sweep(engine, prompts, drafters=arms, default_k=default_k, make_gate=lambda: runtime.make_gate(R),
                          runs=R.runs, max_tokens=R.max_tokens, seed=R.seed, interleave=R.interleave, progress=print,
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
ver = verify_cost.bench_verify(engine, m_values=range(1, max(R.k) + 2), rounds=16, kv_depth=R.kv_depth, seed=R.seed)
vm = costmodel.fit_verify_model(costmodel.verify_frame(ver))
pred = costmodel.predict(cells, rows, vm)
lab.table("cost-model", pred)
within = float((pred["error"].abs() <= 0.10).mean())
lab.metric("costmodel/within_10pct", within)
lab.figure("predicted_vs_measured", pred[pred["temperature"] == 0], name="predicted-vs-measured")
print(f"cost model: {within:.0%} of cells within ±10%; losing cells and their dominant term:")
print(pred[pred["losing_term"].notna()][["drafter", "workload", "k", "losing_term"]].to_string(index=False))
