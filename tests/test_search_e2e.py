"""02's search end to end on the real engine and the real embedded model, tiny parameters:
the decisions table, the held-out check on prompts the search never chose on, and advise,
the worksheet and reproduce's summary saying the same thing per workload."""

from __future__ import annotations

import json

import pytest

from labkit.config.recipe import effective_recipe
from labkit.provenance import reproduce as rp
from labkit.provenance import tracking
from labkit.report import advise, worksheet
from labkit.report.queries import load_table

pytestmark = pytest.mark.slow  # papermill end to end: one search

# two workloads, two prompts each: one chooses, one checks; a second round on one reserve prompt
# (the third of each file) for what one prompt leaves undecided (a tiny search, not a decision)
SEARCH = {"k": [0, 1, 2, 4], "workloads": ["edit", "code"], "prompts_per_workload": 2, "check_share": 0.5,
          "runs": 1, "max_runs": 2, "reserve_prompts": 1, "max_tokens": 16, "drafters": ["ngram"],
          "temperatures": [0.0], "policy_k_max": 4}


@pytest.fixture(scope="module")
def run(store):
    s = rp.reproduce(only=["02"], out_dir=str(store / "out"), params=SEARCH)
    assert s["ok"], [(r["notebook"], r["error"]) for r in s["results"]]
    return s["results"][0]


def test_the_search_decides_per_workload_and_checks_on_held_out_prompts(run):
    c = tracking.client()
    r = c.get_run(run["run_id"])
    table = load_table(c, r, "search-decisions")
    assert list(table["workload"]) == ["code", "edit"]
    assert set(table["final"]) <= {"on", "off"} and table["line"].str.startswith(("code: ", "edit: ")).all()
    ranking = load_table(c, r, "search-ranking")
    assert set(ranking["k"]) == {1, 2, 4} and (ranking.groupby("workload")["rank"].min() == 1).all()
    checked = load_table(c, r, "search-check-runs")
    swept = load_table(c, r, "sweep-runs")
    # the held-out prompts are measured in the check only, never in the choosing rounds
    assert set(checked["prompt"]).isdisjoint(set(swept["prompt"]))
    # one choosing prompt decides nothing, so each workload's second round measured its reserve
    # prompt (the file's third), fresh, instead of the same prompt again
    assert set(swept[swept["run"] == 2]["prompt"]) == {"edit-03", "code-03"}
    assert set(swept[swept["run"] == 1]["prompt"]).isdisjoint({"edit-03", "code-03"})
    assert (table["prompts"] == 2).all()
    assert len(set(checked["prompt"])) == 2 and checked["lossless"].all()
    # k auto was a candidate in every workload (its rows in the policy table), the ladder's first rung recorded
    assert load_table(c, r, "policy-runs")["drafter"].eq("ngram+priced").any()
    steps = load_table(c, r, "protocol-steps")
    assert {"aa", "ngram"} <= set(steps["drafter"]) and (steps[steps["drafter"] == "ngram"]["k"] == 1).all()
    winner = json.loads(r.data.tags["protocol.winner"])
    assert winner["by"] == "search" and "search.mix" in r.data.tags


def test_advise_the_worksheet_and_the_summary_agree(run, capsys):
    c = tracking.client()
    eff = effective_recipe({"recipe": "default", **SEARCH})
    adv = advise.advise(c, eff)
    assert adv["by"] == "search" and adv["source"] == run["id"]
    lines = {r["workload"]: r["line"] for r in adv["per_workload"]}
    sheet = {f["field"].strip(): f["value"] for f in worksheet.worksheet(c, eff)}
    # the worksheet's item 7 says each workload's line under its name (the name said once)
    assert lines["edit"] == f"edit: {sheet['edit']}" and lines["code"] == f"code: {sheet['code']}"
    assert adv["mix"] == f"the mix {sheet['the mix']}"
    one = advise.advise(c, eff, workload="edit")["per_workload"]
    assert [x["line"] for x in one] == [lines["edit"]]
    # the terminal's form of it: each workload's line first, the mix after, no line over 300 characters
    from labkit.commands import MAX_LINE
    from labkit.commands.advise import lines as human

    said = human(adv)
    assert said[0].startswith(lines["code"]) and adv["mix"] in said and max(map(len, said)) <= MAX_LINE
    from labkit.commands.reproduce import _decisions

    _decisions([{**run, "notebook": "02_k_sweep", "status": "FINISHED"}])
    err = capsys.readouterr().err
    assert lines["edit"] in err and lines["code"] in err and adv["mix"] in err


def test_advise_write_puts_each_workloads_setting_into_the_recipe(run, tmp_path):
    import yaml

    from labkit.config import recipe as rc

    path = tmp_path / "mine.yaml"
    data = {**yaml.safe_load((rc.experiments_dir() / "default.yaml").read_text()), **SEARCH, "name": "default"}
    path.write_text("# mine\n" + yaml.safe_dump(data))
    r = rc.load(path)
    res = advise.write_winner(tracking.client(), r)
    back = rc.load(path)
    assert set(back.workload_settings) == {"edit", "code"}
    for v in back.workload_settings.values():
        assert v == "off" or v.startswith("ngram k=")
    assert res["workload_settings"] == back.workload_settings and path.read_text().startswith("# mine\n")
