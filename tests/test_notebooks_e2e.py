"""Every notebook under real papermill on the embedded model, tiny parameters, one store:
02 sweeps, 03 and 05 read it, 04 runs the tool suite, 06 renders the matrix from the runs."""

from __future__ import annotations

import pytest

from labkit.config.recipe import load
from labkit.provenance import reproduce as rp
from labkit.provenance import tracking
from labkit.report import advise, matrix, worksheet
from labkit.report.regen import regen

pytestmark = pytest.mark.slow  # papermill end to end: a sweep and five notebooks

# max_runs 1: one round, however undecided its verdicts (a tiny sweep, not a decision)
SWEEP = {"k": [0, 2], "workloads": ["edit"], "prompts_per_workload": 1, "runs": 1, "max_runs": 1, "max_tokens": 16,
         "drafters": ["ngram"], "temperatures": [0.0], "protocol": "stepwise"}


@pytest.fixture(scope="module")
def summary(store):
    params = {**SWEEP, "toolsuite_tasks": 3, "toolsuite_runs": 1, "toolsuite_k": 2, "power_workload": "edit"}
    return rp.reproduce(only=["02", "03", "04", "05", "06"], out_dir=str(store / "out"), params=params)


def test_all_notebooks_finish(summary):
    failed = [(r["notebook"], r["error"]) for r in summary["results"] if r["status"] != "FINISHED"]
    assert not failed and summary["ok"]
    assert [r["notebook"] for r in summary["results"]] == ["02_k_sweep", "03_acceptance_by_position",
                                                            "04_tool_suite_qc", "05_power", "06_results_matrix"]


def test_sweep_figures_regenerate(summary, tmp_path):
    sweep_id = summary["results"][0]["id"]
    for name in ("tok-s-vs-k", "speedup-heatmap", "predicted-vs-measured"):
        assert regen(f"{sweep_id}/{name}", out_dir=tmp_path)["identical"], name


def test_downstream_notebooks_cite_the_sweep(summary):
    c = tracking.client()
    sweep_id = summary["results"][0]["id"]
    for r in summary["results"][1:4:2]:  # 03 and 05
        assert c.get_run(r["run_id"]).data.tags["lab.source"] == sweep_id


def test_matrix_worksheet_and_advice_from_the_runs(summary):
    c = tracking.client()
    m = matrix.results_matrix(c)
    row = m[m["drafter"] == "ngram"].iloc[0]
    assert row["source"] == summary["results"][0]["id"] and "×) @" in row["n_max=2"]
    recipe = load()
    from labkit.config.recipe import effective_recipe

    eff = effective_recipe({"recipe": "default", **SWEEP})
    fields = {f["item"]: f for f in worksheet.accounting(c, eff)}
    assert fields["production concurrency (re-bench)"]["candidate"].startswith("no data")
    assert "a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818" in fields[
        "model artifact (path + checksum + quant)"]["baseline"]
    assert fields["tool suite runs"]["source"] == summary["results"][2]["id"]
    assert "per token" in fields["energy / CPU time per token"]["candidate"]
    assert fields["energy / CPU time per token"]["source"] == summary["results"][3]["id"]
    assert fields["decision (keep/reject, owner)"]["candidate"].split(":")[0] in ("keep", "reject")
    adv = advise.advise(c, eff)
    assert adv["source"] == summary["results"][0]["id"] and adv["per_workload"][0]["workload"] == "edit"
    assert recipe.name == "default"


def test_downstream_notebook_alone_finds_the_sweep(summary, store):
    """03 run on its own, with the recipe's (larger) sweep fields, still finds the tiny sweep
    of the same recipe; naming a run that is not a sweep is refused with the fix."""
    again = rp.reproduce(only=["03"], out_dir=str(store / "out-03"))
    assert again["ok"], again["results"][0]["error"]
    c = tracking.client()
    assert c.get_run(again["results"][0]["run_id"]).data.tags["lab.source"] == summary["results"][0]["id"]
    wrong = rp.reproduce(only=["03"], out_dir=str(store / "out-03b"), params={"sweep": summary["results"][2]["id"]})
    assert not wrong["ok"] and "not of 02_k_sweep" in wrong["results"][0]["error"]
