"""The command line: --help everywhere, human output by default and --json alone on stdout, clear errors with exit 2."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from labkit.cli import COMMANDS


def labkit(*args, check=True, env=None):
    p = subprocess.run([sys.executable, "-m", "labkit.cli", *args], capture_output=True, text=True, env=env,
                       timeout=900)
    if check and p.returncode != 0:
        raise AssertionError(f"labkit {args} exited {p.returncode}:\n{p.stderr[-3000:]}")
    return p


def last_json(p):
    """--json's answer: one JSON document, alone on stdout."""
    assert len(p.stdout.strip().splitlines()) == 1, p.stdout[-2000:]
    return json.loads(p.stdout)


def test_top_level_help_lists_commands():
    out = labkit("--help").stdout
    for name in COMMANDS:
        assert name in out


@pytest.mark.parametrize("cmd", sorted(COMMANDS))
def test_every_command_has_help(cmd):
    p = labkit(cmd, "--help")
    assert "usage:" in p.stdout


def test_unknown_command():
    p = labkit("frobnicate", check=False)
    assert p.returncode == 2 and "unknown command" in p.stderr


def test_a_command_skips_the_last_collection_at_exit():
    """labkit.teardown: the CLI registers gc.freeze() as an exit handler before the command
    imports anything, so an exit handler registered earlier (here, before the CLI was
    imported; such handlers run later) finds the survivors frozen: the interpreter's last
    collection has nothing left to walk (benchmarks/bench_exit.py times it)."""
    code = ("import atexit, gc, os, sys\n"
            "atexit.register(lambda w=os.write: w(1, f'frozen {gc.get_freeze_count()}'.encode()))\n"
            "from labkit import cli\n"
            "sys.exit(cli.main(['frobnicate']))")
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert p.returncode == 2 and "unknown command" in p.stderr
    frozen = int(p.stdout.rsplit("frozen ", 1)[1])
    assert frozen > 1_000, p.stdout  # every object alive then (~5,800 for an unknown command)
    bare = subprocess.run([sys.executable, "-c", code.replace("cli.main(['frobnicate'])", "2")], capture_output=True,
                          text=True, timeout=300)
    assert bare.stdout.strip() == "frozen 0"  # without the CLI's registration nothing is frozen


def test_models_lists_embedded_with_sha():
    p = labkit("models", "gemma-3-270m-q4_k_m", "--verify", "--json")
    row = last_json(p)["models"][0]
    assert row["sha256"].startswith("a5fd3b62") and row["verified"] is True


@pytest.mark.slow
def test_bench_verify_json():
    p = labkit("bench", "verify", "--m", "1-3", "--rounds", "3", "--kv-depth", "64", "--json")
    d = last_json(p)
    assert [r["m"] for r in d["verify"]] == [1, 2, 3]
    for r in d["verify"]:
        assert r["n"] == 3 and r["min"] <= r["median"] <= r["max"] and len(r["values"]) == 3
    assert d["kv_depth"] == 64 and d["H_ms"]["median"] > 0
    # the flags recorded are the ones setup built the wheel with (its build.json), not a fallback
    import json
    import sys
    from pathlib import Path

    built = json.loads((Path(sys.prefix) / "share" / "labkit" / "llama-build.json").read_text())
    build = d["provenance"]["engine"]["build"]
    assert build["cmake_args"] == built["cmake_args"] and not build["cmake_args"].startswith("unknown")
    assert build["llama_cpp_commit"] == built["llama_cpp_commit"]
    assert d["provenance"]["recipe"]["name"] == "default"
    assert d["provenance"]["recipe"]["gate"]["source"].startswith("recipe file")


@pytest.mark.slow
def test_bench_spec_edit_is_lossless():
    p = labkit("bench", "spec", "--workload", "edit", "--k", "4", "--runs", "2", "--max-tokens", "48", "--json")
    d = last_json(p)
    # the verdict: the paired ratio with its interval (one prompt: a t interval over its 2 rounds, df 1)
    import numpy as np
    from scipy import stats

    from labkit.commands.bench import spec_lines

    for key, unit, arm in (("decision", "decode-only", "decode_tok_s"), ("decision_e2e", "end-to-end", "e2e_tok_s")):
        dec = d[key]
        logs = np.log(np.array(d["speculative"][arm]["values"]) / np.array(d["baseline"][arm]["values"]))
        half = stats.t.ppf(0.975, 1) * logs.std(ddof=1) / np.sqrt(2)
        assert dec["unit"] == unit and dec["n_pairs"] == 2 and dec["confidence"] == 0.95
        assert dec["ratio"] == pytest.approx(np.exp(logs.mean()))
        assert (dec["lo"], dec["hi"]) == pytest.approx((np.exp(logs.mean() - half), np.exp(logs.mean() + half)))
        want = "wins" if dec["lo"] > 1.02 else "loses" if dec["hi"] < 0.98 else "no measurable difference"
        assert dec["verdict"] == want and dec["line"].startswith(f"k=4 {unit}: {dec['ratio']:.2f}× (95% CI ")
        assert dec["line"].endswith(f", {want}; 2 pairs")
    lines = spec_lines(d)  # the human form of the same figures
    assert d["decision"]["line"] in lines[0] and all(len(x) <= 300 for x in lines)
    assert d["lossless"] is True
    assert d["baseline"]["decode_tok_s"]["median"] > 0 and d["speculative"]["decode_tok_s"]["median"] > 0
    assert len(d["accept_by_pos"]) == 4 and 0 <= d["acceptance"] <= 1
    assert d["mean_accepted"] > 0 and d["gate"]["threshold"] == 0.6
    assert d["prompt"]["workload"] == "edit"


@pytest.mark.slow
def test_bench_concurrency_carries_each_arms_paired_ratio_with_its_interval():
    """labkit's multi-slot loop, 2 rounds: each arm over plain at the same c, paired by round."""
    import numpy as np
    from scipy import stats

    from labkit.commands.bench_concurrency import UNIT, human

    d = last_json(labkit("bench", "concurrency", "--c", "1", "--k", "0,1", "--runs", "2", "--prompts", "1",
                         "--max-tokens", "8", "--json"))
    rows = {(r["c"], r["k"], r["drafter"]): r for r in d["rows"]}
    (v,) = d["verdicts"]
    logs = np.log(np.array(rows[(1, 1, "ngram")]["agg_runs"]) / np.array(rows[(1, 0, "none")]["agg_runs"]))
    half = stats.t.ppf(0.975, 1) * logs.std(ddof=1) / np.sqrt(2)
    assert (v["c"], v["k"], v["pairs"], v["unit"]) == (1, 1, 2, UNIT)
    assert (v["ratio"], v["lo"], v["hi"]) == pytest.approx(tuple(np.exp(logs.mean() + x) for x in (0, -half, half)))
    want = "wins" if v["lo"] > 1.02 else "loses" if v["hi"] < 0.98 else "no measurable difference"
    assert v["verdict"] == want and v["line"].endswith(f", {want}; 2 round pairs")
    lines = human(d)  # the human form of the same figures: the verdict first
    assert lines[1].strip() == v["line"] and all(len(x) <= 300 for x in lines)


@pytest.mark.parametrize(
    "args, needle",
    [
        (["bench", "spec", "--workload", "edit", "--k", "-1"], "negative"),
        (["bench", "spec", "--workload", "poetry", "--k", "2"], "unknown workload"),
        (["bench", "verify", "--recipe", "nope"], "recipe not found"),
        (["bench", "verify", "--m", "one-eight"], "list of integers"),
        (["bench", "verify", "--model", "/tmp/definitely-missing.gguf"], "not found"),
    ],
)
def test_bad_input_exits_2_with_a_fix(args, needle):
    p = labkit(*args, check=False)
    assert p.returncode == 2, p.stderr
    assert needle in p.stderr and "fix:" in p.stderr


def test_prompt_longer_than_context(tmp_path):
    f = tmp_path / "long.txt"
    f.write_text("word " * 5000)
    p = labkit("bench", "spec", "--prompt-file", str(f), "--k", "2", check=False)
    assert p.returncode == 2 and "raise n_ctx" in p.stderr


@pytest.mark.slow
def test_toolsuite_scores_each_seeded_run():
    """``labkit toolsuite --spec on --runs 2``: the runs go task by task (each prompt computed
    once for both), and each seeded run is scored on its own."""
    out = last_json(labkit("toolsuite", "--spec", "on", "--drafter", "ngram", "--k", "1", "--runs", "2", "--tasks", "2",
                           "--temperature", "0.7", "--json"))
    assert out["spec"] == "on" and out["drafter"] == "ngram" and out["k"] == 1 and out["tasks"] == 2
    assert len(out["runs"]) == 2 and all(r["n"] == 2 and 0 <= r["score"] <= 1 for r in out["runs"])


# -- the output convention: human by default, --json alone on stdout --------------------------
def test_models_human_by_default_json_on_request():
    human = labkit("models").stdout.splitlines()
    doc = last_json(labkit("models", "--json"))
    assert len(human) == len(doc["models"]) and not any(x.startswith("{") for x in human)
    assert all(x.startswith(f"{m['name']}: {m['kind']}") for x, m in zip(human, doc["models"]))


def test_json_is_one_document_that_jq_reads(capsys):
    """A one-pair interval has no upper end: --json writes it as null (jq refuses Infinity/NaN)."""
    import argparse
    import math

    from labkit.commands import output

    output(argparse.Namespace(json=True), ["never printed"], {"hi": math.inf, "lo": 0.5, "v": [math.nan, 1.0]})
    out = capsys.readouterr().out
    assert out.count("\n") == 1 and json.loads(out) == {"hi": None, "lo": 0.5, "v": [None, 1.0]}
    output(argparse.Namespace(json=False), lambda: ["a line", "another"], {"x": 1})
    assert capsys.readouterr().out == "a line\nanother\n"


def test_json_with_nothing_to_print_and_a_closed_pipe_say_so_without_a_traceback():
    p = labkit("ui", "--json", check=False)
    assert p.returncode == 2 and "nothing to print as JSON" in p.stderr and "fix: run it without --json" in p.stderr
    # the reader has gone before the first write (`| true` exits while labkit still imports)
    p = subprocess.run(["bash", "-c", f"{sys.executable} -m labkit.cli models | true; echo rc=${{PIPESTATUS[0]}} >&2"],
                       capture_output=True, text=True, timeout=120)
    assert "Traceback" not in p.stderr and p.stderr.strip().endswith("rc=141"), p.stderr
