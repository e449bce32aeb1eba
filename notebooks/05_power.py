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
# # 05 · Power: energy and CPU time per token, k = 0 vs best k
#
# The decode window only (prefill excluded), the same workload and prompts for k = 0 and
# the best k the k sweep found for that workload, ≥ 3 runs each. Energy is a hardware
# counter delta (RAPL, IOReport, NVML) or reported unavailable with the reason — never
# estimated. CPU-seconds per token needs no counter and is always reported.

# %% tags=["parameters"]
recipe = "default"
power_workload = None
power_k = None  # None: the best k for the workload from the newest 02_k_sweep of this recipe
runs = 2  # rounds of the power runs (the recipe's runs is the search's first look: 1)
max_tokens = None
prompts_per_workload = 2  # the power runs measure one workload: 2 prompts keep 05 at its time (02 needs 20 to choose and check, 10 more in reserve)
sweep = None  # LAB ID of the 02_k_sweep run the best k comes from; None: the newest matching this recipe

# %%
import pandas as pd

from labkit import lab as labkit_lab
from labkit.config import runtime
from labkit.measure import energy, power
from labkit.report import advise
from labkit.suites.workloads import prompts_for

lab = labkit_lab.start(globals())
R = lab.recipe
lab.table("counters", pd.DataFrame([{"source": k, **v} for k, v in power.discover().items()]).astype(str))

# %%
if R.power_k is None:
    best = advise.best_for(lab.client, R, R.power_workload)
    lab.client.set_tag(lab.run_id, "lab.source", best["source"])
else:
    best = {"drafter": R.drafters[0], "k": R.power_k, "source": "recipe power_k"}
print(f"k=0 vs {best['drafter']} k={best['k']} (from {best['source']})")
engine = lab.engine()
drafter = runtime.make_drafter(best["drafter"], R, engine)
prompts = prompts_for(engine, [R.power_workload], limit=R.prompts_per_workload, seed=R.seed)
rows = energy.power_runs(engine, prompts, drafter=drafter, k=best["k"], runs=R.runs, max_tokens=R.max_tokens,
                         seed=R.seed, interleave=R.interleave, progress=lab.progress, control=R.aa_control,
                         **lab.arms("power"))
lab.table("power-runs", rows, display=False)

# %%
summ = energy.summary(rows)
lab.table("power-summary", summ)
lab.metrics(energy.summary_metrics(summ))
modes = energy.two_modes(summ)
lab.client.set_tag(lab.run_id, "power.summary", f"{modes['text']}; energy: {summ['energy'].iloc[0]}")
print(modes["text"])
cmp = lab.table("power-comparison", energy.compare(rows, k=best["k"], margin=R.decision_margin,
                                                   confidence=R.decision_confidence), display=False)
aa = cmp[cmp["drafter"] == "aa"]
if len(aa):
    ok = bool((aa["verdict"] == "no measurable difference").all())
    lab.client.set_tag(lab.run_id, "aa.verdict", aa["verdict"].iloc[0])
    lab.client.set_tag(lab.run_id, "aa.reliable", str(ok).lower())
print("\n".join(cmp["line"]))
