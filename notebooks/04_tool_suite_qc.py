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
# # 04 · Tool-suite quality control: speculation on vs off, at the candidate
#
# The product suite (`data/toolsuite/`, tool-calling tasks scored on parse, schema, tool
# and arguments) runs with speculation off and on at the candidate: an explicit
# `-p toolsuite_k`, else the recipe's `n_max` (written by `labkit advise --write`), else the
# newest sweep's stepwise-protocol winner, else its best global default (the next cell says
# which, and from which run). Greedy outputs must agree; any task that differs is listed
# with its first divergence and logit gap. Sampled runs (seeded) give the noise band: the
# spread of the off runs. The verdict applies the tolerance in points
# (`toolsuite_tolerance_pts`, the chapter's ±10) beside that band; a paired test over tasks
# (exact McNemar, bootstrap) and every task's output on vs off are logged too. Sampled
# runs stop when the answer is known: `toolsuite_min_runs` first, then one more while the
# paired difference's CI straddles -tolerance, up to `toolsuite_runs` (Bonferroni over the
# looks). The runs go task by task: each prompt is computed once for all of a task's runs
# in a pass (the same KV cells and logits, so the same outputs), and an interrupted run
# resumes at the next task.

# %% tags=["parameters"]
recipe = "default"
drafters = None
toolsuite_k = None
toolsuite_runs = None  # sampled runs at most; None: the recipe's
toolsuite_min_runs = None  # sampled runs before the first look; None: the recipe's
toolsuite_temperature = None
toolsuite_tasks = None  # None: the whole suite
n_max = None  # the candidate k; None: the recipe's, else the newest sweep's protocol winner
toolsuite_tolerance_pts = None

# %%
import json

from labkit import lab as labkit_lab
from labkit.config import runtime
from labkit.report.candidate import candidate
from labkit.suites import qc, toolsuite

lab = labkit_lab.start(globals())
R = lab.recipe

# %%
cand = candidate(lab.client, R)
print(f"tool suite at n_max = {cand['k']} ({cand['drafter']}): {cand['why']}")
lab.client.set_tag(lab.run_id, "toolsuite.k", str(cand["k"]))
lab.client.set_tag(lab.run_id, "toolsuite.k_source", json.dumps(cand))
lab.client.set_tag(lab.run_id, "toolsuite.tolerance_pts", str(R.toolsuite_tolerance_pts))

# %%
engine = lab.engine()
skip = lab.skip_if(not engine.has_tokenizer, "the model has no tokenizer (SYNTHETIC): the tool suite needs a real "
                   "vocabulary to build prompts and parse calls")

# %%
if not skip:
    arms = {cand["drafter"]: runtime.make_drafter(cand["drafter"], R, engine)}
    tasks = toolsuite.load_tasks()[: R.toolsuite_tasks]
    res = qc.control(engine, tasks, drafters=arms, k=cand["k"], runs=R.toolsuite_runs,
                     min_runs=R.toolsuite_min_runs, temperature=R.toolsuite_temperature, seed=R.seed,
                     tolerance_pts=R.toolsuite_tolerance_pts, progress=lab.progress, **lab.arms("toolsuite"))
    lab.table("toolsuite-scores", res["scores"])
    lab.table("greedy-divergences", res["divergences"])
    lab.table("toolsuite-tasks", res["task_pairs"], display=False)
    lab.table("toolsuite-paired", res["paired"])
    if not res["looks"].empty:  # the sequential runs: each look's paired CI, and where it stopped
        lab.table("toolsuite-looks", res["looks"], display=False)
    lab.client.set_tag(lab.run_id, "toolsuite.runs", qc.runs_line(res))

# %%
if not skip:
    lab.metrics(qc.metrics(res))
    lab.client.set_tag(lab.run_id, "toolsuite.verdict", json.dumps({n: v["verdict"] for n, v in res["verdicts"].items()}))
    lab.client.set_tag(lab.run_id, "toolsuite.within_tolerance",
                       json.dumps({n: v["within_noise"] for n, v in res["verdicts"].items()}))
    lab.table("verdicts", qc.verdict_table(res))
