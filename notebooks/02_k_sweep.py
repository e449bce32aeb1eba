# ---
# jupyter:
#   jupytext:
#     formats: ipynb,py:percent
#     text_representation:
#       extension: .py
#       format_name: percent
#   kernelspec:
#     display_name: Python 3 (ipykernel)
#     language: python
#     name: python3
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
from labkit import bench, costmodel, runtime, sweep
from labkit import lab as labkit_lab
from labkit.workloads import load_workload

lab = labkit_lab.start(globals())
R = lab.recipe

# %%
engine = lab.engine()
arms = {d: runtime.make_drafter(d, R, engine) for d in R.drafters}
prompts = [p for w in R.workloads for p in load_workload(w, limit=R.prompts_per_workload)]
rows = sweep.k_sweep(engine, prompts, drafters=arms, ks=R.k, runs=R.runs, max_tokens=R.max_tokens,
                     temperatures=tuple(R.temperatures), seed=R.seed, progress=print)
lab.table("sweep-runs", rows, display=False)

# %%
cells = sweep.cell_table(rows)
for c in cells.itertuples():
    tag = f"{c.drafter}.{c.workload}.T{c.temperature:g}"
    lab.metric(f"tok_s.{tag}", c.tok_s, lo=c.tok_s_min, hi=c.tok_s_max, step=c.k)
    lab.metric(f"speedup.{tag}", c.speedup, lo=c.speedup_min, hi=c.speedup_max, step=c.k)
lab.table("sweep-cells", cells, noise={"tok_s": ["tok_s_min", "tok_s_max"],
                                       "key": ["drafter", "workload", "k", "temperature"]})

# %%
greedy = cells[cells["temperature"] == 0]
lab.figure("tok_s_vs_k", greedy, name="tok-s-vs-k", noise={"tok_s": ["tok_s_min", "tok_s_max"]})
lab.figure("speedup_heatmap", greedy, name="speedup-heatmap")
best = sweep.best_k(cells)
lab.table("best-k", best)
default_k = sweep.global_default(cells)
lab.table("global-default", default_k)

# %% [markdown]
# ## The gate at the global default: on vs off

# %%
gate_rows = []
for g in default_k[default_k["temperature"] == 0].itertuples():
    if g.k > 0:
        gate_rows.append(sweep.k_sweep(engine, prompts, drafters={g.drafter: arms[g.drafter]}, ks=[0, g.k],
                                       runs=R.runs, max_tokens=R.max_tokens, seed=R.seed, check_lossless=False,
                                       make_gate=lambda: runtime.make_gate(R), progress=print))
if gate_rows:
    import pandas as pd

    gated = sweep.cell_table(pd.concat(gate_rows, ignore_index=True))
    lab.table("gate-on-vs-off", sweep.gate_comparison(cells, gated))

# %% [markdown]
# ## Latency, repetition, and the cost model

# %%
lab.table("latency", sweep.latency_table(rows))
rep = sweep.repetition_table(rows)
if not rep.empty:
    lab.figure("acceptance_vs_repetition", rep, name="acceptance-vs-repetition")

# %%
ver = bench.bench_verify(engine, m_values=range(1, max(R.k) + 2), rounds=16, kv_depth=R.kv_depth, seed=R.seed)
vm = costmodel.fit_verify_model(costmodel.verify_frame(ver))
pred = costmodel.predict(cells, rows, vm)
lab.table("cost-model", pred)
within = float((pred["error"].abs() <= 0.10).mean())
lab.metric("costmodel.within_10pct", within)
lab.figure("predicted_vs_measured", pred[pred["temperature"] == 0], name="predicted-vs-measured")
print(f"cost model: {within:.0%} of cells within ±10%; losing cells and their dominant term:")
print(pred[pred["losing_term"].notna()][["drafter", "workload", "k", "losing_term"]].to_string(index=False))
