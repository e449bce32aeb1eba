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
# # 03 · Acceptance by position
#
# Reads the k sweep logged by `02_k_sweep` for the same recipe (no re-measurement) and
# shows, per workload and k: acceptance at each draft position (position 0 = the first
# drafted token), mean accepted length, and the time spent on drafts that were rejected.
#
# Denominators: **per tested token**, P(accept i | positions < i accepted) = accepted at
# i / tested at i; **per draft** (vLLM's per-position rate) = accepted at i / drafts that
# reached i; **per drafted token** (llama.cpp's `n_accept / n_draft`) = accepted / drafted.

# %% tags=["parameters"]
recipe = "default"
sweep = None  # LAB ID of the 02_k_sweep run to read; None: the newest matching this recipe

# %%
from labkit import lab as labkit_lab
from labkit.analysis import sweep_tables
from labkit.report import evidence, queries

lab = labkit_lab.start(globals())
R = lab.recipe
src, src_id = queries.source_run(lab.client, "02_k_sweep", R)
lab.client.set_tag(lab.run_id, "lab.source", src_id)
print(f"measurements from [{src_id}]")
rows = queries.load_table(lab.client, src, "sweep-runs")

# %%
pos = sweep_tables.position_table(rows)
lab.table("acceptance-by-position", pos)
kmax = int(pos["k"].max())
top = pos[(pos["k"] == kmax) & (pos["temperature"] == 0)]
lab.figure("accept_by_position", top, name="accept-by-position", value="accept_cond",
           title=f"P(accept position i | all before accepted), k = {kmax}, greedy")
lab.figure("accept_by_position", top, name="accept-per-draft", value="accept_per_draft",
           title=f"accepted at position i / drafts, k = {kmax}, greedy")

# %%
rej = sweep_tables.rejection_table(rows)
lab.table("accepted-length-and-rejected-time", rej)
lab.metrics(sweep_tables.rejection_metrics(rej, kmax))

# %% [markdown]
# Where the draft length policy (`k: auto`, measured by 02 as an arm beside the fixed k)
# chose which j: the share of steps at each j per workload and per quarter of the
# generation, and the tokens such a step emitted. Empty when 02's recipe had no `auto`.

# %%
prow = evidence.table_or_none(lab.client, src, "policy-runs")  # None: 02 ran no policy arm
pj = lab.table("policy-j", sweep_tables.policy_j_table(prow))
if pj.empty:
    print(f"no policy arm in [{src_id}]: add auto to the recipe's k (k: [0, 1, 2, 3, auto]) and rerun 02")
else:
    lab.figure("policy_j", pj, name="policy-j", title="where k: auto chose which j (share of steps)")
