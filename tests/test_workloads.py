"""The shipped workloads load and look right; bad files fail with a message that helps."""

from __future__ import annotations

import json
import re

import pytest

from labkit.errors import LabkitError
from labkit.suites import workloads
from labkit.suites.workloads import (
    WORKLOADS,
    Prompt,
    all_workloads,
    load_prompt_file,
    load_workload,
)


@pytest.fixture
def fake_root(tmp_path, monkeypatch):
    """A project root whose data/workloads/ the test fills in."""
    (tmp_path / "data" / "workloads").mkdir(parents=True)
    monkeypatch.setenv("LABKIT_ROOT", str(tmp_path))
    return tmp_path


def _write(root, name, lines):
    path = root / "data" / "workloads" / f"{name}.jsonl"
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


def test_names_are_the_shipped_workload_files():
    """WORKLOADS lists exactly the files under data/workloads, and the default recipe uses them."""
    from labkit.config.recipe import load
    from labkit.paths import data_dir

    shipped = {p.stem for p in (data_dir() / "workloads").glob("*.jsonl")}
    assert set(WORKLOADS) == shipped and len(WORKLOADS) == len(shipped)
    assert set(load("default").workloads) <= shipped


@pytest.mark.parametrize("name", WORKLOADS)
def test_shipped_workload_is_well_formed(name):
    prompts = load_workload(name)
    assert len(prompts) >= 8
    assert len({p.id for p in prompts}) == len(prompts)
    for p in prompts:
        assert p.workload == name
        assert p.id.startswith(f"{name}-")
        assert p.source == "written for labkit"
        assert p.text.strip()


def test_edit_prompts_end_where_the_copy_begins():
    prompts = load_workload("edit")
    demo = prompts[0].text.split("\n\nOriginal ")[0]
    for p in prompts:
        # The same worked example, then the passage, then one line announcing the change
        # and nothing else, so the model's continuation is the edited copy.
        assert p.text.startswith(demo + "\n\nOriginal ")
        assert p.text.count("\n\nThe same ") == 2
        assert p.text.endswith(":\n")


def test_prose_zh_is_chinese():
    for p in load_workload("prose_zh"):
        han = len(re.findall(r"[\u4e00-\u9fff]", p.text))
        assert han / len(p.text) > 0.6, p.id


def test_tool_json_prompts_open_a_call():
    for p in load_workload("tool_json"):
        assert p.text.endswith('Call: {"name": "')


def test_limit_takes_the_first_prompts():
    full = load_workload("code")
    assert load_workload("code", limit=3) == full[:3]
    with pytest.raises(LabkitError, match="at least 1"):
        load_workload("code", limit=0)


def test_more_prompts_than_a_file_holds_is_refused(fake_root):
    rec = [json.dumps({"id": f"code-{i}", "prompt": "def f():", "source": "s"}) for i in range(3)]
    _write(fake_root, "code", rec)
    workloads.require_prompts(["code", workloads.SYNTHETIC_IDS], 3)  # as many as it holds; SYNTHETIC has no file
    with pytest.raises(LabkitError) as e:
        workloads.require_prompts(["code"], 4)
    assert "prompts_per_workload = 4, but workload 'code' holds 3 prompts" in str(e.value)
    assert "lower prompts_per_workload to 3" in e.value.fix and "code.jsonl" in e.value.fix
    # a root without the file: reproduce leaves it to whoever loads it; anyone else is told
    workloads.require_prompts(["edit"], 4, missing_ok=True)
    with pytest.raises(LabkitError, match="workload file not found"):
        workloads.require_prompts(["edit"], 4)


def test_a_recipe_asking_more_prompts_than_a_file_holds_records_nothing(store):
    from labkit.provenance import reproduce as rp

    n = len(load_workload("edit"))
    with pytest.raises(LabkitError, match=f"prompts_per_workload = {n + 1}, but workload 'edit' holds {n}"):
        rp.reproduce(only=["02"], params={"prompts_per_workload": n + 1, "reserve_prompts": 0},
                     out_dir=str(store / "out"))
    # the search's reserve counts too: the default's 20 prompts and n reserve ones do not fit
    with pytest.raises(LabkitError, match=rf"prompts_per_workload \+ reserve_prompts = 20 \+ {n}, but workload "
                                          rf"'edit' holds {n}(.|\n)*lower reserve_prompts to {n - 20} or less"):
        rp.reproduce(only=["02"], params={"reserve_prompts": n}, out_dir=str(store / "out"))
    assert not (store / "out").exists() and not (store / "mlflow.db").exists()


def test_all_workloads_returns_every_name_in_order():
    got = all_workloads(limit=1)
    assert list(got) == list(WORKLOADS)
    assert all(len(v) == 1 for v in got.values())


def test_unknown_workload_names_the_known_ones():
    with pytest.raises(LabkitError) as e:
        load_workload("poetry")
    assert "poetry" in str(e.value)
    for name in WORKLOADS:
        assert name in str(e.value)


def test_malformed_line_names_file_and_line(fake_root):
    good = json.dumps({"id": "code-01", "prompt": "def f():", "source": "s"})
    path = _write(fake_root, "code", [good, "{not json"])
    with pytest.raises(LabkitError, match=re.escape(f"{path}:2")):
        load_workload("code")


@pytest.mark.parametrize(
    "record, message",
    [
        ({"id": "x", "source": "s"}, "missing keys \\['prompt'\\]"),
        ({"id": "x", "prompt": "p", "source": "s", "extra": 1}, "unknown keys \\['extra'\\]"),
        ({"id": "x", "prompt": "   ", "source": "s"}, "empty"),
        ({"id": 3, "prompt": "p", "source": "s"}, "'id' must be a string"),
        (["not", "an", "object"], "expected a JSON object"),
    ],
)
def test_bad_records_are_rejected(fake_root, record, message):
    _write(fake_root, "edit", [json.dumps(record)])
    with pytest.raises(LabkitError, match=message):
        load_workload("edit")


def test_duplicate_ids_are_rejected(fake_root):
    rec = json.dumps({"id": "a", "prompt": "p", "source": "s"})
    path = _write(fake_root, "edit", [rec, rec])
    with pytest.raises(LabkitError, match=re.escape(f"{path}:2: duplicate")):
        load_workload("edit")


def test_missing_workload_file_is_an_error(fake_root):
    with pytest.raises(LabkitError, match="not found"):
        load_workload("prose_en")


def test_txt_prompt_file_is_kept_verbatim(tmp_path):
    path = tmp_path / "mine.txt"
    path.write_text("Once upon a time\n", encoding="utf-8")
    assert load_prompt_file(path) == Prompt(
        id="mine", workload="file", text="Once upon a time\n", source=str(path))


def test_jsonl_prompt_file_gives_the_first_record(tmp_path):
    path = tmp_path / "set.jsonl"
    path.write_text(
        json.dumps({"id": "a", "prompt": "first", "source": "me", "note": "n"}) + "\n"
        + json.dumps({"id": "b", "prompt": "second", "source": "me"}) + "\n",
        encoding="utf-8",
    )
    p = load_prompt_file(path)
    assert (p.id, p.text, p.note) == ("a", "first", "n")


@pytest.mark.parametrize("name, content, message", [
    ("empty.txt", "  \n", "empty"),
    ("prompt.md", "hello", "unsupported"),
])
def test_bad_prompt_files(tmp_path, name, content, message):
    path = tmp_path / name
    path.write_text(content, encoding="utf-8")
    with pytest.raises(LabkitError, match=message):
        load_prompt_file(path)


def test_missing_prompt_file(tmp_path):
    with pytest.raises(LabkitError, match="not found"):
        load_prompt_file(tmp_path / "nope.txt")


def test_workload_path_is_under_data_dir(fake_root):
    assert workloads.workload_path("edit") == fake_root / "data" / "workloads" / "edit.jsonl"
