"""Recipes: one dataclass, unknown keys refused by name, values checked, a stable hash."""

from __future__ import annotations

import pytest

from labkit.config import recipe as rc
from labkit.errors import LabkitError


def test_every_shipped_recipe_loads():
    from labkit.paths import experiments_dir

    paths = sorted(experiments_dir().glob("*.yaml"))
    assert paths, "experiments/ holds the recipes"
    for p in paths:
        r = rc.load(p)
        assert r.name == p.stem
        assert len(r.hash) == 12


def test_default_recipe_is_the_embedded_model():
    r = rc.load()
    assert r.model == "gemma-3-270m-q4_k_m"
    assert r.model_sha256.startswith("a5fd3b62")
    assert r.gate == 0.6


def test_unknown_key_is_named_with_a_suggestion(tmp_path):
    p = tmp_path / "r.yaml"
    p.write_text("name: r\nmax_token: 12\n")
    with pytest.raises(LabkitError) as e:
        rc.load(p)
    assert "unknown key 'max_token'" in str(e.value)
    assert "max_tokens" in e.value.fix


@pytest.mark.parametrize(
    "body, needle",
    [
        ("k: [0, -1]", "negative"),
        ("k: three", "wrong type"),
        ("drafters: [lookahead]", "unknown drafter"),
        ("drafters: [model]", "needs draft_model"),
        ("gate: 1.5", "outside [0, 1]"),
        ("engine: vllm", "unknown engine"),
        ("model_sha256: abc", "not a sha256"),
        ("runs: 0", "runs = 0"),
        ("toolsuite_min_runs: 0", "toolsuite_min_runs = 0: the first look needs a sampled run"),
        ("- just\n- a list", "mapping"),
        ("name: [unclosed", "not valid YAML"),
    ],
)
def test_bad_values(tmp_path, body, needle):
    p = tmp_path / "bad.yaml"
    p.write_text(body + "\n")
    with pytest.raises(LabkitError, match=None) as e:
        rc.load(p)
    assert needle in str(e.value)


def test_hash_tracks_fields_not_formatting(tmp_path):
    a = tmp_path / "a.yaml"
    b = tmp_path / "b.yaml"
    a.write_text("name: x\nk: [0, 3]\n")
    b.write_text("# a comment\nk:   [0, 3]\nname: x\n")
    assert rc.load(a).hash == rc.load(b).hash
    b.write_text("name: x\nk: [0, 4]\n")
    assert rc.load(a).hash != rc.load(b).hash
    # a field added later, at its default, leaves the hash as it was; another value changes it
    b.write_text("name: x\nk: [0, 3]\ntoolsuite_min_runs: 1\n")
    assert rc.load(a).hash == rc.load(b).hash
    b.write_text("name: x\nk: [0, 3]\ntoolsuite_min_runs: 2\n")
    assert rc.load(a).hash != rc.load(b).hash


def test_scalar_k_means_a_list(tmp_path):
    p = tmp_path / "s.yaml"
    p.write_text("k: 3\ntemperatures: 0\n")
    r = rc.load(p)
    assert r.k == [3] and r.temperatures == [0.0]


def test_missing_recipe_lists_the_available_ones():
    with pytest.raises(LabkitError) as e:
        rc.load("no-such-recipe")
    assert "default" in e.value.fix
