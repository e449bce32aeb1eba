"""08_plan under real papermill and MLflow: it finishes, logs the plan and the published
comparison, and `labkit export LAB:…/plan-vs-published --format md` prints the side-by-side table."""

from __future__ import annotations

import json

import pytest

from labkit.provenance import reproduce as rp

pytestmark = pytest.mark.slow  # papermill end to end (~1 minute; a short probe first on a host without a profile)


def test_08_plan_reproduces_and_exports_plan_vs_published(store, capsys):
    from labkit import cli

    s = rp.reproduce(only=["08"], out_dir=str(store / "out"), wait=900)  # queue behind another reproduction
    r = s["results"][0]
    assert s["ok"] and r["notebook"] == "08_plan", r["error"]
    nb = json.loads(open(r["executed"]).read())
    printed = "".join("".join(o.get("text", "")) for c in nb["cells"] for o in c.get("outputs", []))
    assert "this box's record: " in printed and "{'" not in printed  # a phrase, never a dict printed raw
    assert cli.main(["export", f"{r['id']}/plan-vs-published", "--format", "md"]) == 0
    out = capsys.readouterr().out.strip().splitlines()
    assert out[0].startswith("| source | row | n_max | published_tok_s | predicted_tok_s")
    assert sum(1 for line in out if line.startswith("| chapter3 §E")) == 7
    assert cli.main(["export", f"{r['id']}/plan-vs-published", "--format", "md", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["rows"] == 7
    assert cli.main(["export", f"{r['id']}/plan-e", "--format", "csv"]) == 0
    assert "speedup" in capsys.readouterr().out.splitlines()[0]
