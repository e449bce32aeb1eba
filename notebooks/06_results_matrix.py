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
# # 06 · Results matrix and accounting worksheet
#
# Built only from logged runs (no measurement): the newest k sweep of every recipe in
# the tracking store, one row per model/recipe/drafter, each cell
# "tok/s (speedup×) @ acceptance%", and the worksheet for this notebook's recipe.
# Fields without a run behind them say so.

# %% tags=["parameters"]
recipe = "default"
workload = "all"  # "all" pools the workloads (median of per-workload cells)

# %%

from labkit import lab as labkit_lab
from labkit.report import matrix

lab = labkit_lab.start(globals())
R = lab.recipe

# %%
lab.table("results-matrix", matrix.results_matrix(lab.client, workload=workload))

# %%
import pandas as pd

from labkit.report import worksheet

lab.table("worksheet", pd.DataFrame(worksheet.worksheet(lab.client, R)))
