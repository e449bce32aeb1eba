"""Both worksheets from a real tiny reproduction (02 sweep, 04 tool suite, 06 matrix) on the
embedded model; the decision words and residency labels on small frames."""

from __future__ import annotations

import json
import re

import pandas as pd
import pytest

import tiny  # tests/tiny.py
from labkit.config.recipe import effective_recipe, from_dict
from labkit.engines.llamacpp import build_info as engine_build_info
from labkit.provenance import ids, tracking
from labkit.provenance import reproduce as rp
from labkit.report import candidate, decision, evidence, worksheet
from labkit.report.queries import load_table
from labkit.suites import qc

SWEEP = {"k": [0, 1, 2], "workloads": ["edit"], "prompts_per_workload": 1, "runs": 1, "max_tokens": 16,
         "drafters": ["ngram"], "temperatures": [0.0],
         "protocol": "full"}  # the whole grid, whatever wins on this box: these tests read its every cell


@pytest.fixture(scope="module")
def book(store):
    params = {**SWEEP, "toolsuite_tasks": 3, "toolsuite_runs": 1, "owner": "alice"}
    s = rp.reproduce(only=["02", "04", "06"], out_dir=str(store / "out"), params=params)
    assert s["ok"], [(r["notebook"], r["error"]) for r in s["results"]]
    return {r["notebook"]: r for r in s["results"]}


def _recipe(**kw):
    return effective_recipe({"recipe": "default", **SWEEP, **kw})


@pytest.mark.slow  # papermill: 02 + 04 + 06
def test_tool_suite_runs_at_the_candidate_and_logs_task_pairs(book):
    c = tracking.client()
    sweep_run = c.get_run(book["02_k_sweep"]["run_id"])
    cells = load_table(c, sweep_run, "sweep-cells")
    want = candidate.best_default(cells)
    run = c.get_run(book["04_tool_suite_qc"]["run_id"])
    t = run.data.tags
    assert t["toolsuite.k"] == str(want["k"]) and t["toolsuite.tolerance_pts"] == "10.0"
    src = json.loads(t["toolsuite.k_source"])
    assert "best global default" in src["how"] and src["source"] == book["02_k_sweep"]["id"]
    assert "±10" in json.loads(t["toolsuite.verdict"])["ngram"]
    pairs = load_table(c, run, "toolsuite-tasks")
    assert len(pairs) == 3 * 2 and set(pairs["mode"]) == {"greedy", "sampled"}  # 3 tasks, greedy + 1 sampled run
    assert {"output_off", "output_on", "correct_off", "correct_on", "same_output"} <= set(pairs.columns)
    paired = load_table(c, run, "toolsuite-paired")
    g = pairs[pairs["mode"] == "greedy"]
    row = paired[paired["mode"] == "greedy"].iloc[0]
    assert row["lost"] == int((g["correct_off"] & ~g["correct_on"]).sum()) and 0 <= row["mcnemar_p"] <= 1
    assert "toolsuite/mcnemar_p.ngram" in run.data.metrics
    assert set(paired["k"]) == set(pairs["k"]) == {want["k"]}  # the suite itself ran at the candidate's n_max


@pytest.mark.slow  # papermill: 02 + 04 + 06
def test_accounting_table_every_field_sourced_or_no_data(book):
    c = tracking.client()
    rows = worksheet.accounting(c, _recipe(), owner="bob")
    assert [r["item"] for r in rows] == list(worksheet.ITEMS)
    for r in rows:
        sourced = r["source"] is not None and ids.ID_RE.match(r["source"].split(",")[0])
        missing = str(r["baseline"]).startswith("no data:") or str(r["candidate"]).startswith("no data:")
        assert sourced or missing, r
    by = {r["item"]: r for r in rows}
    assert by["production concurrency (re-bench)"]["candidate"].startswith("no data: no 07_concurrency run")
    model = by["model artifact (path + checksum + quant)"]["baseline"]
    assert "a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818" in model and "Q4_K" in model
    assert ".gguf" in model  # the path, from the engine record
    assert "llama.cpp commit" in by["engine build (pinned commit)"]["baseline"]
    # which CPU variant and which patches, from the run's own build record
    build = engine_build_info()
    notes = by["engine build (pinned commit)"]["notes"]
    if "GGML_AVX2=ON" in build["cmake_args"] and "GGML_AVX512=ON" not in build["cmake_args"]:
        assert "portable AVX2 build" in notes, notes
    assert all(p["name"].removesuffix(".patch") in notes for p in build.get("patches") or []), notes
    dec = by["decision (keep/reject, owner)"]
    assert dec["candidate"].split(":")[0] in ("keep", "reject") and "owner: bob" in dec["notes"]
    assert dec["notes"].split("speculation: ")[1].split(":")[0] in ("keep", "widen", "narrow (shorten drafts)",
                                                                     "disable")
    steps = by["acceptance at each step"]["candidate"]
    assert "n_max=1:" in steps and "n_max=2:" in steps and "Full grid" in steps
    assert "only 1 warm run(s): the chapter asks for 3" in by["warm decode tok/s (3 runs, range)"]["notes"]
    # mean accept length: the pooled step counts of the logged runs
    rs = load_table(c, c.get_run(book["02_k_sweep"]["run_id"]), "sweep-runs")
    k = int(by["n_max (off vs candidate)"]["candidate"].split("n_max=")[1])
    g = rs[(rs["k"] == k) & (~rs["cold"]) & (rs["drafter"] == "ngram")]
    assert by["mean accept length"]["candidate"].startswith(f"{g['decode_tokens'].sum() / g['steps'].sum():.2f}")


@pytest.mark.slow  # papermill: 02 + 04 + 06
def test_field_worksheet_has_the_seven_items(book):
    rows = worksheet.accounting(tracking.client(), _recipe())
    short = worksheet.field_sheet(rows)
    assert [f["item"][:2] for f in short] == [f"{i}." for i in range(1, 8)]
    assert "no data: no owner" in short[6]["value"]  # no --owner and the recipe names none
    word = short[6]["value"].split(":")[0]
    if word == "keep":  # a keep without a 07 run is provisional (which verdict depends on the box's timings)
        assert "provisional: production concurrency not re-benched" in short[6]["value"]
    else:
        # a reject names why: a loss, or no measurable difference (the simpler option)
        assert word == "reject" and any(w in short[6]["value"] for w in (
            "does not beat plain", "loses", "no measurable difference from plain")), short[6]["value"]
        assert "widen" not in short[6]["value"]  # a reject never asks for longer drafts
    assert short[5]["source"] == rows[8]["source"]  # the tool-suite run


@pytest.mark.slow  # papermill: 02 + 04 + 06
def test_notebook_06_logged_both_worksheets_with_the_recipe_owner(book):
    c = tracking.client()
    run = c.get_run(book["06_results_matrix"]["run_id"])
    field = load_table(c, run, "worksheet-field")
    acc = load_table(c, run, "worksheet-accounting")
    assert len(field) == 7 and list(acc.columns) == ["item", "baseline", "candidate", "notes", "source"]
    assert "owner: alice" in field["value"].iloc[6]


@pytest.mark.slow  # papermill: 02 + 04 + 06
def test_worksheet_command_prints_both(book, capsys):
    from labkit.cli import main

    assert main(["worksheet", "--owner", "carol", "--format", "md", "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert len(doc["field"]) == 7 and len(doc["accounting"]) == len(worksheet.ITEMS)
    assert main(["worksheet", "--owner", "carol", "--format", "md"]) == 0
    text = capsys.readouterr().out
    assert "| item | baseline | candidate | notes | source |" in text and "[LAB:WORKSHEET §field]" in text
    assert "owner: carol" in text


@pytest.mark.slow  # papermill: 02 + 04 + 06
def test_stepwise_winner_and_concurrency_are_read_when_logged(book, store, monkeypatch):
    """SYNTHETIC: the stepwise protocol (02's protocol-steps/protocol.winner) and 07_concurrency
    come from other branches; their logged shapes are written here under their own recipe name
    (the sweep tables are the real ones) to check the worksheet reads them."""
    from labkit.lab.session import Lab

    monkeypatch.setenv("LABKIT_JOURNAL", str(store / "synthetic-journal.jsonl"))
    c = tracking.client()
    real = c.get_run(book["02_k_sweep"]["run_id"])
    r = from_dict({**SWEEP, "name": "synthetic-stepwise"})
    sweep = Lab(notebook="02_k_sweep", recipe=r, params={})
    for name in ("sweep-cells", "sweep-runs", "cost-model"):
        sweep.table(name, load_table(c, real, name), display=False)
    steps = pd.DataFrame([
        {"drafter": "ngram", "k": 1, "e2e_speedup": 1.2, "e2e_speedup_min": 1.1, "e2e_speedup_max": 1.3,
         "decode_speedup": 1.25, "acceptance": 0.8, "first_token_acceptance": 0.9, "toolsuite_verdict": "within ±10",
         "passed": True, "stop_reason": None},
        {"drafter": "ngram", "k": 2, "e2e_speedup": 0.95, "e2e_speedup_min": 0.9, "e2e_speedup_max": 1.0,
         "decode_speedup": 0.97, "acceptance": 0.6, "first_token_acceptance": 0.85, "toolsuite_verdict": "within ±10",
         "passed": False, "stop_reason": "end-to-end loss at k=2"}])
    sweep.table("protocol-steps", steps, display=False)
    c.set_tag(sweep.run_id, "protocol.winner", json.dumps({"drafter": "ngram", "k": 1, "source": str(sweep.id)}))
    c.set_tag(sweep.run_id, "protocol.stopped", "k=2: end-to-end loss (0.95×)")
    sweep.finish()
    conc = Lab(notebook="07_concurrency", recipe=r, params={})
    conc.table("concurrency", pd.DataFrame([
        {"c": c_, "k": k, "drafter": "ngram" if k else "none", "engine": "llama-server", "agg_tok_s": t,
         "per_stream_tok_s": t / c_, "ttft_p50_ms": 50.0, "ttft_p95_ms": 60.0, "ttlt_p50_ms": 900.0,
         "ttlt_p95_ms": 990.0, "acceptance": 0.7 if k else None, "rows_per_step": 1.0, "speedup": t / b,
         "lossless": True} for c_, b in ((1, 34.0), (4, 43.0)) for k, t in ((0, b), (1, b * 0.9))]), display=False)
    conc.table("concurrency-verdict", pd.DataFrame([{"c": 4, "k": 1, "speedup": 0.9, "verdict": "loses at c=4"}]),
               display=False)
    conc.finish()

    assert candidate.candidate(c, r) == {"drafter": "ngram", "k": 1, "source": str(sweep.id),
                                         "how": f"the stepwise protocol's winner [{sweep.id}]",
                                         "why": f"the stepwise protocol's winner [{sweep.id}]"}
    by = {x["item"]: x for x in worksheet.accounting(c, r, owner="dana")}
    steps_text = by["acceptance at each step"]["candidate"]
    # steps logged without CIs (this synthetic table has none) are read as medians, the stop marked
    assert steps_text == "ngram n_max=1: 1.20×, acc 80%; ngram n_max=2: 0.95×, acc 60% (stop)"
    conc_row = by["production concurrency (re-bench)"]
    assert conc_row["baseline"] == "c=4, tok/s aggregate: llama-server 43.0"
    assert conc_row["candidate"] == "c=4, tok/s aggregate: llama-server 38.7 (ngram k=1, 0.90×)"
    assert "loses at c=4" in conc_row["notes"] and conc_row["source"] == str(conc.id)
    assert by["n_max (off vs candidate)"]["candidate"] == "ngram n_max=1"


def _conc_rows(engine: str, plain: float, spec: float, drafter: str, cs=(1, 4)) -> list[dict]:
    return [{"c": c_, "k": k, "drafter": drafter if k else "none", "engine": engine, "agg_tok_s": t,
             "speedup": t / plain} for c_ in cs for k, t in ((0, plain), (1, spec))]


def test_production_concurrency_reports_each_engine_against_its_own_plain_arm():
    """The shape of 07's tables at c=4 (numbers from the reproduction [LAB:07-017462-pgqdm]):
    labkit's loop loses (52.0 -> 48.1) while llama-server gains (50.3 -> 51.7). The row
    must not pool the two plain arms (51.2) nor set one engine's best against the other's."""
    table = pd.DataFrame(_conc_rows("labkit", 52.03, 48.08, "ngram") + _conc_rows("llama-server", 50.3, 51.67,
                                                                                   "ngram-simple"))
    verdict = pd.DataFrame([{"c": 4, "k": 1, "drafter": "ngram", "engine": "labkit", "speedup": 0.924,
                             "verdict": "loses at c=4", "other_engine_speedup": 1.027}])
    base, cand, notes = worksheet.concurrency_fields(table, verdict, 4)
    assert base == "c=4, tok/s aggregate: labkit 52.0; llama-server 50.3"
    assert cand == "c=4, tok/s aggregate: labkit 48.1 (ngram k=1, 0.92×); llama-server 51.7 (ngram-simple k=1, 1.03×)"
    assert notes == "labkit: loses at c=4"
    assert worksheet.concurrency_loss(verdict, "LAB:07-x") == "labkit loses at c=4 (0.92×) [LAB:07-x]"
    assert worksheet.concurrency_loss(verdict.assign(speedup=1.03), "LAB:07-x") is None
    assert worksheet.concurrency_loss(None, "LAB:07-x") is None
    # no production concurrency in the recipe: the highest c, said so; one engine alone is fine
    base, cand, notes = worksheet.concurrency_fields(table[table["engine"] == "labkit"], None, None)
    assert base == "c=4, tok/s aggregate: labkit 52.0" and "highest c measured" in notes
    # an engine with no plain arm at that c is named, never compared with the other's plain arm
    no_plain = table[~((table["engine"] == "labkit") & (table["k"] == 0))]
    base, cand, _ = worksheet.concurrency_fields(no_plain, None, 4)
    assert base == "c=4, tok/s aggregate: labkit (no plain arm); llama-server 50.3"
    only_spec = table[table["k"] > 0]
    assert worksheet.concurrency_fields(only_spec, None, 4)[0].startswith("no data")


def test_residency_labels_old_and_new_shapes():
    old = {"layers_on_accelerator": 0, "layers_on_host": 18, "note": "all weights and KV on the host"}
    assert evidence.residency_text(old, build={"gpu_offload_supported": False}) == (
        "no accelerator in this build: all 18 layers on the host (maximum spill); as asked, not read from the load log")
    assert "none" not in evidence.residency_text(old)
    assert evidence.residency_text({"layers_on_accelerator": 10, "layers_on_host": 8}).startswith(
        "10/18 layers offloaded, 8 on the host")
    new = {"asked": {"n_gpu_layers": 99, "n_cpu_moe": 4}, "label": "experts spilled to host",  # SYNTHETIC record
           "placed": {"buffers_mib": {"CUDA0": 5120.0, "CPU": 2048.4}, "layers_offloaded": 20, "layers_total": 24}}
    text = evidence.residency_text(new)
    assert text.startswith("experts spilled to host; 20/24 layers offloaded; buffers CUDA0 5120 MiB, CPU 2048 MiB")
    assert text.endswith("; asked n_cpu_moe=4, n_gpu_layers=99 (from the load log)")
    zero = evidence.residency_text({**new, "asked": {"n_gpu_layers": 0, "n_cpu_moe": 0}})
    assert "asked" not in zero and zero.endswith("CPU 2048 MiB (from the load log)")  # defaults go unsaid
    assert evidence.residency_text(None).startswith("no data:")


def _cells(speedups: dict[tuple[str, int], float]) -> pd.DataFrame:
    """SYNTHETIC greedy sweep cells: (workload, k) -> speedup."""
    return pd.DataFrame([{"drafter": "ngram", "workload": w, "k": k, "temperature": 0.0, "speedup": s}
                         for (w, k), s in speedups.items()])


@pytest.mark.parametrize("speedups, cand_k, configured, word", [
    ({("edit", 1): 1.2, ("edit", 2): 1.3, ("edit", 3): 1.1}, 2, None, "keep"),
    ({("edit", 1): 1.2, ("edit", 2): 1.3}, 2, None, "widen"),
    ({("edit", 1): 1.2, ("edit", 2): 1.3, ("edit", 3): 1.1}, 2, 3, "narrow"),
    ({("edit", 1): 1.2, ("edit", 2): 1.3, ("code", 1): 1.1, ("code", 2): 0.9}, 2, None, "narrow"),
    ({("edit", 1): 0.9, ("edit", 2): 0.8}, 1, None, "disable"),
])
def test_speculation_words(speedups, cand_k, configured, word):
    d = decision.speculation_words(_cells(speedups), {"drafter": "ngram", "k": cand_k}, configured=configured)
    assert d["word"] == word and d["text"].startswith(word)


def test_speculation_words_go_through_the_verdicts():
    win = {"verdict": "wins", "text": "1.20× (95% CI 1.10–1.30)"}
    tie = {"verdict": "no measurable difference", "text": "1.01× (95% CI 0.97–1.05)"}
    # a median above 1.00 without a measurable gain is not a reason to widen: disable (the simpler option)
    d = decision.speculation_words(_cells({("edit", 1): 1.2, ("edit", 2): 1.3}), {"drafter": "ngram", "k": 2},
                                   e2e=tie)
    assert d["word"] == "disable" and "no measurable difference" in d["text"] and "1.01×" in d["text"]
    d = decision.speculation_words(_cells({("edit", 1): 1.2, ("edit", 2): 1.3}), {"drafter": "ngram", "k": 2},
                                   e2e=win)
    assert d["word"] == "widen" and "95% CI 1.10–1.30" in d["text"]
    # per workload, the cells' verdicts (not their medians) say where it loses and where shorter wins
    cells = _cells({("edit", 1): 1.2, ("edit", 2): 1.3, ("code", 1): 1.1, ("code", 2): 0.9, ("edit", 3): 1.0})
    cells["verdict"] = ["wins", "wins", "no measurable difference", "loses", "no measurable difference"]
    d = decision.speculation_words(cells, {"drafter": "ngram", "k": 2}, e2e=win)
    assert d["word"] == "keep" and "loses on code" in d["text"]  # code's k=1 is no diff, not a win
    cells.loc[2, "verdict"] = "wins"
    d = decision.speculation_words(cells, {"drafter": "ngram", "k": 2}, e2e=win)
    assert d["word"] == "narrow" and "code wins at n_max=1 but loses at 2" in d["text"]


def test_widen_is_not_said_when_the_protocol_stopped_on_a_loss():
    d = decision.speculation_words(_cells({("edit", 1): 1.2, ("edit", 2): 1.3}), {"drafter": "ngram", "k": 2},
                                   stopped="k=3: end-to-end loss")
    assert d["word"] == "keep"


def test_candidate_keep_or_reject():
    win = {"ratio": 1.2, "lo": 1.1, "hi": 1.3, "verdict": "wins", "text": "1.20× (95% CI 1.10–1.30)", "pairs": 30}
    assert decision.candidate_verdict(e2e=win, decode=1.3, tool_ok=True, lossless=True) == ("keep", [])
    lose = {**win, "ratio": 0.97, "lo": 0.95, "hi": 0.99, "verdict": "loses", "text": "0.97× (95% CI 0.95–0.99)"}
    word, why = decision.candidate_verdict(e2e=lose, decode=1.3, tool_ok=True, lossless=True)
    assert word == "reject" and why[0] == "end-to-end 0.97× (95% CI 0.95–0.99) loses"
    # no measurable difference is a result, and the decision is the simpler option
    tie = {**win, "ratio": 1.01, "lo": 0.97, "hi": 1.05, "verdict": "no measurable difference",
           "text": "1.01× (95% CI 0.97–1.05)"}
    word, why = decision.candidate_verdict(e2e=tie, decode=1.3, tool_ok=True, lossless=True)
    assert word == "reject" and "no measurable difference from plain, so the simpler option" in why[0]
    assert decision.candidate_verdict(e2e=win, decode=1.3, tool_ok=False, lossless=True)[0] == "reject"
    assert decision.candidate_verdict(e2e=win, decode=1.3, tool_ok=True, lossless=False)[0] == "reject"
    word, why = decision.candidate_verdict(e2e=win, decode=1.3, tool_ok=None, lossless=True)
    assert word == "keep" and "provisional" in why[0]
    word, why = decision.candidate_verdict(e2e=win, decode=1.3, tool_ok=True, lossless=True, concurrency=False)
    assert word == "keep" and why == ["provisional: production concurrency not re-benched"]
    loss = "labkit loses at c=4 (0.92×) [LAB:07-017462-pgqdm]"
    word, why = decision.candidate_verdict(e2e=win, decode=1.3, tool_ok=True, lossless=True, concurrency_loss=loss)
    assert word == "keep" and why == [f"but at the production concurrency: {loss}"]
    word, why = decision.candidate_verdict(e2e=win, decode=1.3, tool_ok=False, lossless=True, concurrency_loss=loss)
    assert word == "reject" and all("concurrency" not in w for w in why)


def test_candidate_when_the_protocol_found_no_winner_is_its_first_measured_step():
    """SYNTHETIC protocol-steps: both drafters lost at k=1, the model drafter less badly; the
    candidate judged (tool suite, worksheets) is that step, not k=0 (off vs off judges nothing)."""
    steps = pd.DataFrame([
        {"drafter": "ngram", "k": 1, "e2e_speedup": 0.92, "passed": False, "measured": True,
         "stop_reason": "loses end-to-end: k=1 e2e 0.92x; acceptance collapse"},
        {"drafter": "model", "k": 1, "e2e_speedup": 0.97, "passed": False, "measured": True,
         "stop_reason": "loses end-to-end: k=1 e2e 0.97x"},
        {"drafter": "model", "k": 2, "e2e_speedup": 1.5, "passed": False, "measured": False,
         "stop_reason": "predicted by replay"}])
    sw = evidence.Sweep(id="LAB:02-aaaaaa-bbbbb", steps=steps,
                        winner={"drafter": "ngram", "k": 0, "source": "LAB:02-aaaaaa-bbbbb/protocol-steps"})
    got = candidate.candidate(None, _recipe(protocol="stepwise"), sweep=sw)
    assert (got["drafter"], got["k"]) == ("model", 1) and got["source"] == "LAB:02-aaaaaa-bbbbb/protocol-steps"
    assert "found no winning n_max" in got["how"] and "loses end-to-end: k=1 e2e 0.97x" in got["how"]
    assert got["why"] == got["how"]  # what 04 prints: the how cites its source already, so once
    assert candidate.first_loss(None) is None and candidate.first_loss(steps.iloc[2:]) is None
    # a how without its source gets it appended; none, nothing ("[None]" was printed before)
    mine = candidate.candidate(None, _recipe(n_max=2))
    assert mine["why"] == f"{mine['how']} [{mine['source']}]" and mine["source"].startswith("recipe n_max")
    assert candidate._with_why({"how": "x", "source": None})["why"] == "x"


def test_a_step_the_replay_decided_reads_not_measured():
    """SYNTHETIC steps: a step the replay ruled out has no measured speedup (NaN), never "nan×"."""
    steps = pd.DataFrame([
        {"drafter": "model", "k": 1, "e2e_speedup": float("nan"), "acceptance": None, "first_token_acceptance": None,
         "passed": False, "measured": False, "stop_reason": "loses end-to-end (predicted by replay, not measured)"},
        {"drafter": "ngram", "k": 1, "e2e_speedup": 1.06, "acceptance": 0.89, "first_token_acceptance": 0.89,
         "passed": True, "measured": True, "stop_reason": ""}])
    text = decision.steps_text(steps, None, "ngram", "ngram: stopped at k=2")
    assert "model n_max=1: not measured (replay)" in text and "nan" not in text
    assert "ngram n_max=1: 1.06×, acc 89%" in text
    # a step the replay decided with its prediction's interval over prompts: shown, labelled predicted
    steps.loc[0, ["e2e_speedup", "e2e_lo", "e2e_hi", "verdict"]] = [0.62, 0.58, 0.66, "loses"]
    text = decision.steps_text(steps, None, "ngram", "ngram: stopped at k=2")
    assert text.startswith("model n_max=1: 0.62× [0.58–0.66] loses (replay prediction)")


def test_steps_with_intervals_read_as_short_verdicts_with_the_aa_control_first():
    """SYNTHETIC steps as the protocol now logs them: each step one short clause (estimate,
    CI, verdict, acceptance), the A/A control first, no stop-reason sentence repeated."""
    reason = "no measurable gain end-to-end: ngram n_max=1: 0.98× e2e (95% CI 0.95–1.01), no measurable difference"
    steps = pd.DataFrame([
        {"drafter": "aa", "k": 0, "e2e_speedup": 1.0, "e2e_lo": 0.98, "e2e_hi": 1.01,
         "verdict": "no measurable difference", "acceptance": None, "passed": True, "measured": True,
         "stop_reason": ""},
        {"drafter": "ngram", "k": 1, "e2e_speedup": 0.98, "e2e_lo": 0.95, "e2e_hi": 1.01,
         "verdict": "no measurable difference", "acceptance": 0.89, "passed": False, "measured": True,
         "stop_reason": reason},
        {"drafter": "model", "k": 1, "e2e_speedup": 0.6, "e2e_lo": 0.57, "e2e_hi": 0.63, "verdict": "loses",
         "acceptance": 0.7, "passed": False, "measured": True, "stop_reason": "loses end-to-end: …"}])
    text = decision.steps_text(steps, None, "ngram", "ngram: stopped at k=1")
    assert text == ("A/A no measurable difference; ngram n_max=1: 0.98× [0.95–1.01] no diff., acc 89%; "
                    "model n_max=1: 0.60× [0.57–0.63] loses, acc 70%")
    assert len(text) <= 200
    # a step's interval at a corrected level (sequential looks) says its level, unlike a plain 95% CI
    steps.loc[1, ["confidence", "ci_level"]] = [0.95, 0.995]
    assert "ngram n_max=1: 0.98× [0.95–1.01, 99.5% CI] no diff." in decision.steps_text(steps, None, "ngram", "")


def test_field_sheet_cells_are_short_and_say_each_thing_once():
    """SYNTHETIC accounting rows with the long values a real run gives (full commit, path and
    checksum; the same "no data" for both tool-suite columns): each field cell stays within
    ~200 characters, identifiers cut to 12 hex digits and a file name."""
    nd = "no data: no 04_tool_suite_qc run for recipe default; run labkit reproduce --only 04_tool_suite_qc"
    long = {
        "engine build (pinned commit)": "llama.cpp 0.3.36, llama.cpp commit " + "0c1e57098bba43ac29e6e3b677cdceebdd22334f",
        "model artifact (path + checksum + quant)": "/root/.cache/labkit/models/gemma-3-270m-q4_k_m.gguf sha256 "
                                                    + "a5fd3b62" * 8 + " (gemma3 270M Q4_K - Medium)",
        "tool suite runs": nd,
    }
    rows = [{"item": i, "baseline": long.get(i, "-"), "candidate": long.get(i, "x"), "notes": "" if i in long else "n",
             "source": "LAB:02-aaaaaa-bbbbb"} for i in worksheet.ITEMS]
    short = {f["item"][:2]: f["value"] for f in worksheet.field_sheet(rows)}
    assert short["1."] == ("llama.cpp 0.3.36, llama.cpp commit 0c1e57098bba… | gemma-3-270m-q4_k_m.gguf sha256 "
                           "a5fd3b62a5fd… (gemma3 270M Q4_K - Medium)")
    assert short["6."] == nd  # not "off no data …; on no data …"
    assert all(len(v) <= 200 for v in short.values())
    # the tool-suite cell as a real run gave it (LAB:04-9c2470-gfiwe, 217 characters): the verdict's
    # restated bands go, the scores stay once
    notes = ("within ±10: on 17.3%-25.0% (median 21.2%) vs off band 17.3%-21.2%; median inside the measured band; "
             "paired McNemar p = 0.549; ran at n_max=1")
    suite = {"baseline": "greedy 28.8%; sampled 17.3%-21.2%", "candidate": "greedy 26.9%; sampled 17.3%-25.0%",
             "notes": notes}
    rows = [{**r, **suite} if r["item"] == "tool suite runs" else r for r in rows]
    cell = {f["item"][:2]: f["value"] for f in worksheet.field_sheet(rows)}["6."]
    assert cell == ("off greedy 28.8%; sampled 17.3%-21.2%; on greedy 26.9%; sampled 17.3%-25.0%; within ±10: "
                    "median inside the measured band; paired McNemar p = 0.549; ran at n_max=1")
    regression = "regression: on 5.0% vs off band 17.3%-21.2%; worst run 12.3 points below the band (median 12.3), beyond ±10"
    assert worksheet._suite_notes(regression) == ("regression: worst run 12.3 points below the band (median 12.3), "
                                                  "beyond ±10")
    # 04 stopped after one sampled run (decided at its first look): no band to restate or show
    one = qc.verdict([0.192], [0.212])["verdict"]
    assert one == "within ±10: on 21.2% vs off 19.2% (one run: no band); at or above the off run"
    assert worksheet._suite_notes(one) == "within ±10: at or above the off run"
    assert worksheet._sampled({"s.lo": 0.192, "s.hi": 0.192}, "s") == "; sampled 19.2%"



# -- the output convention, every command on this module's real store ---------------------
# (here, not in a module of its own: this store's 02 + 04 + 06 reproduction is the real one the
# forms read, and a second module would have to make another)
MAX_LINE = 300
_NUM = re.compile(r"(?<![\w.:/-])-?\d+\.\d+(?![\w.])")


def _numbers(obj) -> list[float]:
    """Every number in a JSON object, including those inside its strings (its verdict lines)."""
    if isinstance(obj, bool) or obj is None:
        return []
    if isinstance(obj, (int, float)):
        return [float(obj)]
    if isinstance(obj, str):
        return [float(x) for x in _NUM.findall(obj)]
    if isinstance(obj, dict):
        return [x for v in obj.values() for x in _numbers(v)]
    return [x for v in obj for x in _numbers(v)]


def missing_figures(text: str, obj) -> list[str]:
    """Decimal figures the human form prints that the JSON object does not hold (at the
    printed precision, or as a percentage)."""
    have = _numbers(obj)
    out = []
    for tok in _NUM.findall(text):
        d = len(tok.split(".")[1])
        v = float(tok)
        if not any(abs(round(x, d) - v) < 10 ** -d / 2 + 1e-12 or abs(round(x * 100, d) - v) < 10 ** -d / 2 + 1e-12
                   for x in have):
            out.append(tok)
    return out


def human_and_json(capsys, argv: list[str], *, ok=(0,)) -> tuple[list[str], dict]:
    """A command's default output (checked: no line over MAX_LINE, no JSON object) and its
    --json output (checked: one JSON document, alone on stdout)."""
    from labkit.cli import main

    rc = main(argv)
    out = capsys.readouterr().out
    assert rc in ok, (argv, rc)
    lines = out.splitlines()
    assert lines, argv
    long = [x for x in lines if len(x) > MAX_LINE]
    assert not long, (argv, [len(x) for x in long], long[0][:400])
    assert not any(x.lstrip().startswith(("{", "[{")) for x in lines), (argv, out[-500:])
    rc = main([*argv, "--json"])
    js = capsys.readouterr().out
    assert rc in ok and len(js.strip().splitlines()) == 1, (argv, js[-500:])
    return lines, json.loads(js)


def _two_hosts(c, book, tmp_path, monkeypatch) -> str:
    """SYNTHETIC: the real sweep's runs logged again as two hosts of recipe synthetic-compare
    (each round again at 0.9×, so that an interval exists), host-b's tok/s exactly 1.1× host-a's:
    the paired interval is then 1.1–1.1, and any mispairing (prompt, temperature, round) widens it."""
    from labkit.lab.session import Lab

    real = c.get_run(book["02_k_sweep"]["run_id"])
    path = tiny.recipe_file(tmp_path / "synthetic-compare.yaml", **SWEEP)
    monkeypatch.setenv("LABKIT_JOURNAL", str(tmp_path / "synthetic-journal.jsonl"))
    for label, f in (("synthetic-host-a", 1.0), ("synthetic-host-b", 1.1)):
        monkeypatch.setenv("LABKIT_HOST_LABEL", label)
        lab = Lab(notebook="02_k_sweep", recipe=from_dict({**SWEEP, "name": "synthetic-compare"}), params={})
        rows = load_table(c, real, "sweep-runs")
        # a second round, 0.9× the first on both hosts: an interval, and a pairing that matters
        again = rows.assign(run=rows["run"] + 1000, decode_tok_s=rows["decode_tok_s"] * 0.9,
                            e2e_tok_s=rows["e2e_tok_s"] * 0.9)
        rows = pd.concat([rows, again], ignore_index=True)
        for col in ("decode_tok_s", "e2e_tok_s"):
            rows[col] = rows[col] * f
        cells = load_table(c, real, "sweep-cells")
        cells["tok_s"] = cells["tok_s"] * f
        lab.table("sweep-runs", rows, display=False)
        lab.table("sweep-cells", cells, display=False)
        lab.finish()
    monkeypatch.delenv("LABKIT_HOST_LABEL")
    return path


@pytest.mark.slow  # papermill: 02 + 04 + 06
def test_every_command_speaks_human_by_default_and_json_on_request(book, capsys, tmp_path, monkeypatch):
    """Each command's form on a real store: the default output is a few lines a person reads
    (none over 300 characters, no JSON object); --json is one JSON document holding the same
    figures. Engine commands are run by test_cli/test_multislot with --json; their human form
    is checked here from that same object (measuring twice would not give the same figures)."""
    c = tracking.client()
    run02 = book["02_k_sweep"]["id"]
    forms = [
        ["show", run02], ["show", f"{run02}/sweep-cells"], ["show", "LAB:WORKSHEET §field"],
        ["show", "LAB:RESULTS-MATRIX §E"], ["show", "LAB:RESULTS-MATRIX"],
        ["advise"], ["advise", "--workload", "edit"],
        ["worksheet", "--owner", "carol"],
        ["export", "LAB:WORKSHEET §accounting", "--format", "md", "--out", str(tmp_path / "acc.md")],
        ["regen", f"{run02}/sweep-cells", "--out", str(tmp_path / "regen")],

        ["compare", "--recipe", _two_hosts(c, book, tmp_path, monkeypatch), "--by", "host"],
        ["models"], ["machine", "show"], ["plan", "--published"], ["power"],
        ["sync", str(tmp_path / "no-journals")],
    ]
    (tmp_path / "no-journals").mkdir()
    capsys.readouterr()  # what logging the synthetic runs printed
    seen = {}
    for argv in forms:
        lines, obj = human_and_json(capsys, argv)
        assert not missing_figures("\n".join(lines), obj), (argv, missing_figures("\n".join(lines), obj))
        seen[tuple(argv[:2])] = (lines, obj)
    lines, obj = human_and_json(capsys, ["server", "info"], ok=(0, 1))  # 1: not built on this machine
    # 1: §E redrawn now differs from 06's copy (this module logs synthetic sweeps after 06)
    lines, obj = human_and_json(capsys, ["regen", "LAB:RESULTS-MATRIX §E", "--out", str(tmp_path / "r")], ok=(0, 1))
    assert obj["identical"] is not None and lines[0].startswith("[LAB:RESULTS-MATRIX §E] redrawn from ")
    # show: the summary, verdict first, then what the run produced by ID and how to see more
    lines, obj = seen[("show", run02)]
    assert lines[0].startswith(f"[{run02}] 02_k_sweep · FINISHED · recipe default · host ")
    # its forest: every arm's paired ratio with its CI (or "one pair: no CI"), verdict, unit, pairs
    assert "found:" in lines and obj["verdicts"] and all(f"  {v}" in lines for v in obj["verdicts"][:10])
    assert all(" CI" in v and "pair" in v and ("end-to-end" in v or "decode-only" in v) for v in obj["verdicts"])
    assert f"  table  [{run02}/sweep-cells]" in lines and lines[-1].startswith(f"see more: labkit show {run02} --json")
    assert obj["status"] == "FINISHED" and "system/disk_usage_megabytes" not in "\n".join(lines)
    # advise: each workload's ratio with its CI, the unit and the number of pairs
    lines, obj = seen[("advise", "--workload")]
    w = obj["per_workload"][0]
    assert lines[0].startswith(f"edit: {w['recommend']} — ") and "decode-only" in lines[0]
    assert w["pairs"] >= 1 and f"; {w['pairs']} pair{'s' if w['pairs'] > 1 else ''} [{obj['source']}]" in lines[0]
    # compare: every ratio with its interval; host-b is exactly 1.1× host-a, pair by pair
    lines, obj = seen[("compare", "--recipe")]
    assert obj["ratios"] and all(abs(r["ratio"] - 1.1) < 1e-9 and abs(r["lo"] - 1.1) < 1e-9
                                 and abs(r["hi"] - 1.1) < 1e-9 and r["verdict"] == "wins" for r in obj["ratios"])
    assert all(f"{r['pairs']} pairs" in r["line"] and "decode-only" in r["line"] for r in obj["ratios"])
    assert lines[1].strip() == obj["ratios"][0]["line"]
    # the worksheet: verdict-bearing item 7 in the field sheet, every accounting cell at most ~200
    lines, obj = seen[("worksheet", "--owner")]
    assert any(x.startswith("7. decision keep/reject + owner: ") for x in lines)
    long = [(r["item"], k, len(r[k])) for r in obj["accounting"] for k in ("baseline", "candidate", "notes")
            if len(str(r[k])) > worksheet.CELL_MAX]
    assert not long, long


@pytest.mark.slow  # papermill: 02 + 04 + 06
def test_bad_input_and_closed_pipes_answer_without_a_traceback(book, capsys):
    import subprocess
    import sys

    from labkit.cli import main

    run02 = book["02_k_sweep"]["id"]
    figure = next(p for p in tracking._artifacts(tracking.client(), book["02_k_sweep"]["run_id"], "figures"))
    cases = [(["ui", "--json"], "nothing to print as JSON"),
             (["export", f"{run02}/{figure.split('/')[-1]}", "--json"], "figure"),  # a figure ID: regen draws it
             (["show", f"{run02}/no-such-table", "--json"], "no figure, table or cell"),
             (["regen", "LAB:RESULTS-MATRIX", "--json"], "needs one section")]
    for argv, needle in cases:
        assert main(argv) == 2, argv
        cap = capsys.readouterr()
        assert needle in cap.err and "fix:" in cap.err and "Traceback" not in cap.err and cap.out == "", (argv, cap)
    # a reader that goes away: `labkit worksheet | head -3`, and one gone before the first write
    # (`| true` exits at once, while labkit still imports: its first write meets a closed pipe)
    for cmd in ("worksheet", "worksheet --json", f"show {run02}"):
        for reader in ("head -3", "true"):
            p = subprocess.run(["bash", "-c", f"{sys.executable} -m labkit.cli {cmd} | {reader}; "
                                "echo rc=${PIPESTATUS[0]} >&2"], capture_output=True, text=True, timeout=300)
            assert "Traceback" not in p.stderr and "BrokenPipe" not in p.stderr, (cmd, reader, p.stderr)
            assert len(p.stdout.splitlines()) <= 3 and p.stderr.strip().splitlines()[-1] in ("rc=0", "rc=141")
        assert reader == "true" and p.stderr.strip().endswith("rc=141"), (cmd, p.stderr)
