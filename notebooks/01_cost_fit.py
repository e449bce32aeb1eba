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
cost_models = None  # the synthetic dense/MoE pair; None: the recipe's ([] skips the contrast)
crosscheck_rounds = None  # rounds of labkit vs llama-bench; None: the recipe's
crosscheck_tolerance = None  # agreement band (0.10: ±10%); None: the recipe's
op_profile_rounds = None  # rounds of the per-op-class profile; 0 skips it; None: the recipe's

# %%
from labkit import lab as labkit_lab
from labkit.analysis import costmodel
from labkit.measure import verify_cost

lab = labkit_lab.start(globals())
R = lab.recipe

# %%
engine = lab.engine()
res = verify_cost.bench_verify(engine, m_values=R.verify_m, rounds=R.verify_rounds, kv_depth=R.kv_depth, seed=R.seed)
samples = costmodel.verify_frame(res)
H = res["H_ms"]
lab.metric("verify/H_ms", H["median"], lo=H["min"], hi=H["max"])
lab.table("verify-per-m", costmodel.per_m_table(res), noise={"median_ms": ["min_ms", "max_ms"],
                                                            "x_H": ["x_H_min", "x_H_max"], "key": ["m"]})

# %% [markdown]
# ## Cross-check: labkit vs llama-bench on the same build
#
# llama.cpp's own `llama-bench` (prompt processing of m tokens at this KV depth, and the
# generated token) against labkit's decode of the same m rows, round by round, the two
# arms alternating. One build: the `libllama.so` this kernel loaded is the file
# llama-bench links. llama-bench's prompt batch asks for one logit row, so labkit is timed
# that way too (the judged rows); labkit's verify with every logit row is listed beside
# them: the difference is the output head, paid once per drafted row.

# %%
from labkit.analysis import crosscheck as xc
from labkit.measure import crosscheck

cc = crosscheck.for_engine(engine, m_values=R.verify_m, kv_depth=R.kv_depth, rounds=R.crosscheck_rounds,
                           seed=R.seed, progress=lab.progress)
agree = None if cc["skipped"] else xc.agreement(cc["samples"], tolerance=R.crosscheck_tolerance)
lab.tags(crosscheck.tags(agree, cc))
if agree is not None:
    lab.table("crosscheck-samples", cc["samples"], display=False)
    lab.table("crosscheck", agree)
print(crosscheck.tags(agree, cc)["crosscheck.line"])

# %% [markdown]
# The fit on every sample, and the fit of what is actually there: the one-row step runs
# a matrix-vector kernel and is kept apart; for m ≥ 2, odd m can cost more than the next
# even m (row-pair kernels), so that fit has an odd-m term. Residuals per m show which
# describes the data.

# %%
fit = costmodel.fit_verify(samples)
lab.metric("verify/a_ms", fit.a, lo=fit.a_ci[0], hi=fit.a_ci[1])
lab.metric("verify/b_ms", fit.b, lo=fit.b_ci[0], hi=fit.b_ci[1])
lab.metric("verify/r2", fit.r2)
lab.table("verify-fit", costmodel.fit_table(fit))

# %%
lab.figure("verify_cost", samples, name="cost-fit", fit=fit.to_dict(), H_ms=H["median"],
           bench=None if agree is None else agree.to_dict("records"),
           title=f"verify(m) · {R.model} · KV depth {R.kv_depth}",
           noise={"median_ms": ["min_ms", "max_ms"], "key": ["m"]})

# %%
vm = costmodel.fit_verify_model(samples)
lab.table("verify-fit-piecewise", costmodel.fit_table(vm.fit).assign(H_ms=vm.H))
lab.table("residuals", costmodel.residual_table(samples, fit, vm))
lab.figure("verify_cost", samples[samples["m"] >= 2], name="cost-fit-m2-parity", fit=vm.fit.to_dict(),
           H_ms=vm.H, title="verify(m), m ≥ 2, with an odd-m term", noise={"median_ms": ["min_ms", "max_ms"], "key": ["m"]})

# %% [markdown]
# ## Where a verify's time goes: ms per op class
#
# Every node of the llama.cpp graph timed through its `cb_eval` callback, summed per op
# class (the output head, the FFN matmuls, the attention projections, attention itself,
# norms, the rest), for each m, on an engine of its own. The callback makes every node its
# own dispatch, so this is a breakdown, not a timing: the dispatch is its own class and the
# decodes above are the timings. docs/engines.md reads it.

# %%
from labkit.measure import op_profile

ops = op_profile.profile_recipe(R, m_values=R.verify_m, rounds=R.op_profile_rounds,
                                kv_depth=R.kv_depth) if R.op_profile_rounds else None
if ops is not None:
    long = op_profile.frame(ops)
    lab.table("op-profile", op_profile.wide(long))
    lab.figure("op_profile", long, name="op-profile", title=f"verify(m) by op class · {ops['model']}")

# %% [markdown]
# ## Dense vs MoE on matched active parameters — SYNTHETIC random weights, cost only

# %%
from labkit.measure import archcost, verify_cost

if R.cost_models:
    arch = archcost.measure(R.cost_models, m_values=R.verify_m, rounds=R.verify_rounds, kv_depth=R.kv_depth,
                            threads=R.threads, seed=R.seed)
    ac = archcost.contrast(arch)
    lab.table("dense-vs-moe-fits", ac["fits"])
    lab.table("dense-vs-moe-per-m", ac["per_m"])
    lab.metric("synthetic/expert_term_ms_per_row", ac["expert_term_ms_per_row"], lo=ac["expert_term_ci"][0],
               hi=ac["expert_term_ci"][1])
    lab.figure("arch_contrast", arch, name="dense-vs-moe")
