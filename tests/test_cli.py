"""The command line: --help everywhere, JSON as the last line, clear errors with exit 2."""

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
    return json.loads(p.stdout.strip().splitlines()[-1])


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


def test_models_lists_embedded_with_sha():
    p = labkit("models", "gemma-3-270m-q4_k_m", "--verify")
    row = last_json(p)["models"][0]
    assert row["sha256"].startswith("a5fd3b62") and row["verified"] is True


@pytest.mark.slow
def test_bench_verify_json():
    p = labkit("bench", "verify", "--m", "1-3", "--rounds", "3", "--kv-depth", "64")
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
    p = labkit("bench", "spec", "--workload", "edit", "--k", "4", "--runs", "1", "--max-tokens", "48")
    d = last_json(p)
    assert d["lossless"] is True
    assert d["baseline"]["decode_tok_s"]["median"] > 0 and d["speculative"]["decode_tok_s"]["median"] > 0
    assert len(d["accept_by_pos"]) == 4 and 0 <= d["acceptance"] <= 1
    assert d["mean_accepted"] > 0 and d["gate"]["threshold"] == 0.6
    assert d["prompt"]["workload"] == "edit"


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
                           "--temperature", "0.7"))
    assert out["spec"] == "on" and out["drafter"] == "ngram" and out["k"] == 1 and out["tasks"] == 2
    assert len(out["runs"]) == 2 and all(r["n"] == 2 and 0 <= r["score"] <= 1 for r in out["runs"])
