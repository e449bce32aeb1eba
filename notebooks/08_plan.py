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
# # 08 · Plan: price speculation before you run it
#
# `labkit plan` predicts the §E matrix for a model, a placement and a box from the model's
# GGUF header (bytes per layer by role, experts, nextn layers) and a machine profile (host and
# device bandwidth, the engine's fixed step, per-row compute). Here: a plan for the recipe's
# model on this box (its measured profile, cached per host and build), and the planner beside
# the seeds' published §E table, with predicted speedup vs spilled layers for n_max = 1..4.
# Every number in a plan is PREDICTED; `labkit plan --check` sets them beside measurement.

# %% tags=["parameters"]
recipe = "default"
verify_rounds = 8  # rounds of the probe's verify(m), only when this host has no cached profile

# %%
from labkit import lab as labkit_lab
from labkit.analysis import plan, plan_published
from labkit.artifacts import published
from labkit.artifacts.gguf_profile import read_profile
from labkit.artifacts.loader import resolve_model
from labkit.engines.llamacpp import build_info
from labkit.measure import machine
from labkit.provenance.fingerprint import host_info
from labkit.report import plan_tables

lab = labkit_lab.start(globals())
R = lab.recipe
prof = machine.load_or_probe(host=host_info(), build=build_info(), rounds=R.verify_rounds, progress=lab.progress)
lab.client.set_tag(lab.run_id, "plan.machine_key", prof["key"])
print(f"this box: host {prof['host']['bandwidth_gbs']:.1f} GB/s, overhead {prof['overhead_ms']:.2f} ms; "
      f"{prof['device_note']}")
print(plan_tables.record_line(prof))

# %%
model = read_profile(resolve_model(R).path)
acc = plan_tables.acceptance_for(lab.client, R)
print(f"acceptance per position {[round(x, 2) for x in acc['p']]}: {acc['source']} ({acc['why']})")
n_max = [k for k in range(5) if k <= len(acc["p"])]
res = plan.plan(model, prof, placements=[plan.Placement()], n_max=n_max, acceptance=acc["p"], cs=[1, 2, 4])
lab.table("plan-e", plan_tables.e_table(res))
lab.table("plan-b", plan_tables.b_table(res))
print("\n".join(f["text"] for f in res["flips"]))

# %%
data = published.load()
models = published.model_profiles(data)
cmp = plan_published.compare(data, models)
lab.table("plan-vs-published", plan_tables.published_table(cmp["cells"]))
print("\n".join(plan_published.summary_lines(cmp)))

# %%
moe, box = models["moe"], cmp["boxes"]["moe"]
row = plan.Placement(moe.n_layer + 1, 14)
pub = plan.plan(moe, box, placements=[row], n_max=[0, 1, 2, 3, 4], acceptance=plan.from_first_token(0.89, 4))
lab.table("plan-published-row", plan_tables.e_table(pub))
lab.figure("plan_speedup_vs_spill", plan_tables.axis_table(pub), name="plan-speedup-vs-spill",
           points=plan_tables.published_points(cmp["cells"]),
           title="published box (assumed bandwidths; host per-row rate fitted on all published rows), MoE, "
                 "first-token acceptance 0.89: predicted speedup")
