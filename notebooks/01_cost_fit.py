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
# # 01 · Cost fit: what does verifying m rows cost?
#
# One speculative step verifies m = k + 1 rows in one batched pass. This notebook
# measures verify(m) for each m, interleaving m values round by round so that drift
# does not masquerade as a slope, and fits verify(m) ≈ a + b·m with 95% confidence
# intervals. `a` is compared with one plain decode step H; `b` is the marginal cost of
# a row.

# %% tags=["parameters"]
recipe = "default"
verify_m = None  # row counts; None: the recipe's
verify_rounds = None  # rounds over all m; None: the recipe's
kv_depth = None  # KV cache depth the rows are verified at; None: the recipe's

# %%
from labkit import bench, costmodel
from labkit import lab as labkit_lab

lab = labkit_lab.start(globals())
R = lab.recipe

# %%
engine = lab.engine()
res = bench.bench_verify(engine, m_values=R.verify_m, rounds=R.verify_rounds, kv_depth=R.kv_depth, seed=R.seed)
samples = costmodel.verify_frame(res)
H = res["H_ms"]
lab.metric("H_ms", H["median"], lo=H["min"], hi=H["max"])
lab.table("verify-per-m", costmodel.per_m_table(res), noise={"median_ms": ["min_ms", "max_ms"], "key": ["m"]})

# %%
fit = costmodel.fit_verify(samples)
lab.metric("verify_a_ms", fit.a, lo=fit.a_ci[0], hi=fit.a_ci[1])
lab.metric("verify_b_ms", fit.b, lo=fit.b_ci[0], hi=fit.b_ci[1])
lab.metric("verify_r2", fit.r2)
lab.table("verify-fit", costmodel.fit_table(fit))

# %%
lab.figure("verify_cost", samples, name="cost-fit", fit=fit.to_dict(), H_ms=H["median"],
           title=f"verify(m) · {R.model} · KV depth {R.kv_depth}",
           noise={"median_ms": ["min_ms", "max_ms"], "key": ["m"]})
