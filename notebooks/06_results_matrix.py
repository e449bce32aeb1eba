# ---
# jupyter:
#   jupytext:
#     formats: ipynb,py:percent
#     notebook_metadata_filter: labkit
#     text_representation:
#       extension: .py
#       format_name: percent
#       format_version: '1.3'
#       jupytext_version: 1.19.6
#   kernelspec:
#     display_name: labkit (.venv)
#     language: python
#     name: labkit
#   labkit:
#     runs_last: true
# ---

# %% [markdown]
# # 06 · Results matrix and the worksheets
#
# Built only from logged runs (no measurement). The results matrix in the chapter's
# sections, each citable as `[LAB: RESULTS-MATRIX §X]` and logged as a numeric table:
# §A prefill (TTFT and prefill tok/s, apart from decode), §B concurrency (from
# 07_concurrency when it has run), §E the n_max matrix, each cell
# "tok/s (×) @ first-token acceptance% [per drafted token%]". Then the two worksheets for
# this notebook's recipe: the short field worksheet (7 items) and the accounting table
# (Baseline / Candidate / Notes). Fields without a run behind them say "no data: why".

# %% tags=["parameters"]
recipe = "default"
workload = "all"  # "all" pools the workloads (median of per-workload cells)
owner = None  # who owns the keep/reject decision

# %%
import pandas as pd

from labkit import lab as labkit_lab
from labkit.report import matrix, worksheet

lab = labkit_lab.start(globals())
R = lab.recipe

# %%
sec = {s: matrix.section(lab.client, s, **({"workload": workload} if s == "E" else {})) for s in matrix.SECTIONS}
lab.table("results-matrix-E", sec["E"].data, display=False)
matrix.display(sec["E"])

# %%
lab.table("results-matrix-A", sec["A"].data, display=False)
lab.table("results-matrix-B", sec["B"].data, display=False)
print(sec["B"].no_data or f"§B: {len(sec['B'].data)} rows")
matrix.display(sec["A"])

# %%
rows = worksheet.accounting(lab.client, R)
lab.table("worksheet-field", pd.DataFrame(worksheet.field_sheet(rows)))
lab.table("worksheet-accounting", pd.DataFrame(rows))
