"""Which 02 an interactive downstream notebook reads (labkit/lab/upstream.py), on a real
MLflow store: this JupyterLab session's newest finished 02, else this user's newest
interactive 02 of the recipe, else the recipe rule; a reproduction always takes the recipe
rule, and a ``sweep`` the parameters name always wins. The line the notebook prints first
names the run, the reason, and how to pick another."""

from __future__ import annotations

import time

import pytest

from labkit.config.recipe import load, resolve
from labkit.lab import upstream
from labkit.provenance import fingerprint, tracking

SESSION = "box:4242:20261201T100000:abc123"


def _run(c, recipe, *, mode: str, session: str | None = None, user: str | None = None,
         status: str = "FINISHED", notebook: str = "02_k_sweep") -> str:
    tags = {"lab.mode": mode, "recipe": recipe.name, "recipe.sweep_hash": recipe.sweep_hash,
            "host.label": fingerprint.host_label()[0]}
    if session:
        tags[upstream.SESSION_TAG] = session
    if user:
        tags[upstream.USER_TAG] = user
    rid, lab_id = tracking.new_run(c, notebook=notebook, recipe=recipe, tags=tags)
    c.set_terminated(rid, status)
    time.sleep(0.01)  # distinct start times: "newest" is by start time
    return lab_id.cite.strip("[]")


@pytest.fixture
def c(store, monkeypatch):
    monkeypatch.delenv(upstream.SESSION_ENV, raising=False)
    monkeypatch.delenv("JPY_SESSION_NAME", raising=False)
    monkeypatch.setattr(upstream, "user", lambda: "alice")
    return tracking.client()


def test_session_then_user_then_recipe_rule(c, monkeypatch):
    r = load("default")
    tiny = resolve(r, {"runs": 1, "k": [0, 1]})  # an interactive 02 with other sweep fields
    repro = _run(c, r, mode="papermill")
    # no interactive 02 at all: the recipe rule (the reproduction), said as such
    got = upstream.choose(c, notebook="03_acceptance_by_position", recipe=r, interactive=True)
    assert got.lab_id is None and "recipe rule" in got.why
    assert got.line(c, r).startswith(f"Reads 02_k_sweep run `[{repro}]`: the recipe rule")
    mine_other_session = _run(c, tiny, mode="interactive", session="box:1:old:000000", user="alice")
    _run(c, tiny, mode="interactive", session="box:2:other:000000", user="bob")  # newer, another user
    _run(c, tiny, mode="interactive", session="box:3:x:0", user="alice", status="FAILED")  # not finished
    # no run in this session: this user's newest finished interactive 02 of the recipe
    monkeypatch.setenv(upstream.SESSION_ENV, SESSION)
    got = upstream.choose(c, notebook="05_power", recipe=r, interactive=True)
    assert got.lab_id == mine_other_session and "user alice" in got.why
    # this session's 02, even when an older reproduction matches the recipe's sweep fields better
    here = _run(c, tiny, mode="interactive", session=SESSION, user="alice")
    _run(c, r, mode="papermill")  # a newer reproduction does not displace it either
    got = upstream.choose(c, notebook="03_acceptance_by_position", recipe=r, interactive=True)
    assert got.lab_id == here and got.why == "the newest finished one of this JupyterLab session"
    line = got.line(c, r)
    assert line.startswith(f"Reads 02_k_sweep run `[{here}]`: the newest finished one of this JupyterLab session.")
    assert 'set `sweep = "LAB:…"` in the parameters cell' in line
    # a reproduction keeps the recipe rule; a named sweep wins everywhere; 01 reads nothing
    assert upstream.choose(c, notebook="03_acceptance_by_position", recipe=r, interactive=False).lab_id is None
    named = resolve(r, {"sweep": repro}, origin="-p {name}")
    got = upstream.choose(c, notebook="06_results_matrix", recipe=named, interactive=True)
    assert got.lab_id == repro and "-p sweep" in got.why
    assert upstream.choose(c, notebook="01_cost_fit", recipe=r, interactive=True) is None


def test_a_server_without_the_project_config_is_told_apart_by_its_process(monkeypatch):
    monkeypatch.delenv(upstream.SESSION_ENV, raising=False)
    monkeypatch.setenv("JPY_SESSION_NAME", "/x/03_acceptance_by_position.ipynb")
    assert upstream.jupyter_session().endswith(f"server-pid-{__import__('os').getppid()}")
    monkeypatch.delenv("JPY_SESSION_NAME")
    assert upstream.jupyter_session() is None
