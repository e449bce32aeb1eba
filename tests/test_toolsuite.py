"""The tool suite: the shipped tasks load, bad tasks are refused, answers are scored right."""

from __future__ import annotations

import json
import re
from collections import Counter

import pytest

from labkit.errors import LabkitError
from labkit.suites import toolsuite as ts

WEATHER = {
    "name": "get_weather",
    "description": "Get the current weather for a city.",
    "parameters": {
        "type": "object",
        "properties": {
            "city": {"type": "string"},
            "unit": {"type": "string", "enum": ["celsius", "fahrenheit"], "default": "celsius"},
        },
        "required": ["city"],
    },
}
ORDER = {
    "name": "place_order",
    "description": "Order products.",
    "parameters": {
        "type": "object",
        "properties": {
            "items": {"type": "array", "items": {
                "type": "object",
                "properties": {"sku": {"type": "string"}, "quantity": {"type": "integer"}},
                "required": ["sku", "quantity"],
                "additionalProperties": False,
            }},
            "express": {"type": "boolean"},
        },
        "required": ["items"],
    },
}
REFUND = {
    "name": "refund",
    "description": "Refund a payment.",
    "parameters": {
        "type": "object",
        "properties": {"txn": {"type": "string"}, "amount": {"type": "number"}},
        "required": ["txn", "amount"],
    },
}


def task(category="single", tools=(WEATHER,), expected=None, **kw) -> ts.Task:
    if expected is None:
        expected = {"name": "get_weather", "arguments": {"city": "Lisbon"}}
    return ts.Task(id=kw.get("id", "t-1"), category=category, tools=tuple(tools),
                   request=kw.get("request", "Weather in Lisbon?"), expected=expected)


def record(**changes) -> dict:
    rec = {"id": "t-1", "category": "single", "tools": [WEATHER], "request": "Weather in Lisbon?",
           "expected": {"name": "get_weather", "arguments": {"city": "Lisbon"}}}
    rec.update(changes)
    return rec


def write(tmp_path, *records) -> object:
    path = tmp_path / "tasks.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in records), encoding="utf-8")
    return path


# --- the shipped suite --------------------------------------------------------------

def test_shipped_suite_is_balanced():
    tasks = ts.load_tasks()
    counts = Counter(t.category for t in tasks)
    assert set(counts) == set(ts.CATEGORIES)
    assert all(n >= 8 for n in counts.values()), counts
    assert len(tasks) >= 40


def test_shipped_expected_answers_score_correct():
    # The reference answer, rendered the way a model would write it, must earn full marks:
    # this catches tasks whose expectation the scorer itself would reject.
    for t in ts.load_tasks():
        s = ts.score_task(t, " " + json.dumps(t.expected) + "\n")
        assert s.correct, (t.id, s.error)


def test_few_shot_tools_are_not_in_the_suite():
    shots = ts.load_tasks(ts.examples_path())
    shot_tools = {tool["name"] for ex in shots for tool in ex.tools}
    suite_tools = {tool["name"] for t in ts.load_tasks() for tool in t.tools}
    assert shot_tools and not shot_tools & suite_tools
    assert {ex.category for ex in shots} == set(ts.CATEGORIES)


def test_prompt_shows_examples_tools_and_request_and_ends_at_call():
    t = ts.load_tasks()[0]
    prompt = ts.build_prompt(t)
    assert prompt.endswith(f"Request: {t.request}\nCall:")
    for tool in t.tools:
        assert ts.render_tool(tool) in prompt
    # Each worked answer is exactly one line, so STOP ends a well-formed answer.
    for ex in ts.load_tasks(ts.examples_path()):
        line = json.dumps(ex.expected)
        assert f"Request: {ex.request}\nCall: {line}\n" in prompt
        assert ts.STOP not in line


def test_prompt_with_own_examples():
    shot = task(id="s-1", request="Weather in Oslo?",
                expected={"name": "get_weather", "arguments": {"city": "Oslo"}})
    prompt = ts.build_prompt(task(), examples=[shot])
    tools = "Tools:\n" + ts.render_tool(WEATHER)
    assert prompt.endswith(
        f'{tools}\nRequest: Weather in Oslo?\nCall: {{"name": "get_weather", "arguments": {{"city": "Oslo"}}}}'
        f"\n\n{tools}\nRequest: Weather in Lisbon?\nCall:")


def test_render_tool_marks_optional_defaults_and_nesting():
    assert ts.render_tool(WEATHER) == (
        '- get_weather(city: string, unit?: "celsius" | "fahrenheit" = "celsius"): '
        "Get the current weather for a city.")
    assert ts.render_tool(ORDER) == (
        '- place_order(items: list of {"sku": string, "quantity": integer}, express?: boolean): '
        "Order products.")


# --- loading errors -----------------------------------------------------------------

@pytest.mark.parametrize("changes, message", [
    ({"category": "multi"}, "unknown category 'multi'"),
    ({"expected": {"name": "get_time", "arguments": {}}}, "'get_time' is not among"),
    ({"expected": {"name": "get_weather", "arguments": {"town": "Lisbon"}}}, "break the tool's schema"),
    ({"expected": {"name": None}}, "category 'none' only"),
    ({"category": "none"}, "category 'none' only"),
    ({"category": "choose"}, "at least two tools"),
    ({"tools": []}, "non-empty list"),
    ({"tools": [WEATHER, WEATHER]}, "duplicate tool names"),
    ({"tools": [{"name": "x", "description": "d"}]}, "exactly name, description, parameters"),
    ({"tools": [{**WEATHER, "parameters": {"type": "object", "properties": {
        "city": {"type": "string", "pattern": "^[A-Z]"}}}}]}, "unsupported schema keyword"),
    ({"tools": [{**WEATHER, "parameters": {"type": "object", "properties": {
        "city": {"type": "text"}}}}]}, "unknown type 'text'"),
    ({"extra": 1}, "unknown keys \\['extra'\\]"),
])
def test_invalid_tasks_are_refused(tmp_path, changes, message):
    path = write(tmp_path, record(**changes))
    with pytest.raises(LabkitError, match=message):
        ts.load_tasks(path)


def test_error_names_file_and_line(tmp_path):
    path = write(tmp_path, record(), record(id="t-2", category="bogus"))
    with pytest.raises(LabkitError, match=re.escape(f"{path}:2")):
        ts.load_tasks(path)


def test_bad_json_and_duplicate_ids(tmp_path):
    path = tmp_path / "tasks.jsonl"
    path.write_text(json.dumps(record()) + "\n{oops\n", encoding="utf-8")
    with pytest.raises(LabkitError, match="not valid JSON"):
        ts.load_tasks(path)
    with pytest.raises(LabkitError, match="duplicate task id 't-1'"):
        ts.load_tasks(write(tmp_path, record(), record()))


def test_missing_or_empty_file(tmp_path):
    with pytest.raises(LabkitError, match="not found"):
        ts.load_tasks(tmp_path / "absent.jsonl")
    (tmp_path / "empty.jsonl").write_text("\n", encoding="utf-8")
    with pytest.raises(LabkitError, match="no tasks"):
        ts.load_tasks(tmp_path / "empty.jsonl")


def test_loaded_task_round_trips(tmp_path):
    [t] = ts.load_tasks(write(tmp_path, record(note="why")))
    assert (t.id, t.category, t.note) == ("t-1", "single", "why")
    assert t.tool("get_weather") == WEATHER and t.tool("nope") is None


# --- extraction and validation ------------------------------------------------------

def test_extract_call_takes_the_first_object():
    assert ts.extract_call(' {"name": null} {"name": "x"}') == ({"name": None}, None)
    assert ts.extract_call('noise {"a": {"b": [1, 2]}}, more')[0] == {"a": {"b": [1, 2]}}
    assert ts.extract_call("I cannot help")[1] == "no JSON object in output"
    assert ts.extract_call('{"name": "x", ')[1].startswith("invalid JSON")
    assert "duplicate key 'a'" in ts.extract_call('{"a": 1, "a": 2}')[1]


@pytest.mark.parametrize("value, error", [
    ({"items": [{"sku": "A", "quantity": 2}]}, None),
    ({"items": [{"sku": "A", "quantity": 2.0}], "express": True}, None),
    ({"items": [{"sku": "A", "quantity": "2"}]}, "arguments.items[0].quantity: expected integer"),
    ({"items": [{"sku": "A", "quantity": True}]}, "expected integer, got bool"),
    ({"items": [{"sku": "A", "quantity": 1.5}]}, "expected integer, got float"),
    ({"items": [{"sku": "A"}]}, "missing required quantity"),
    ({"items": [{"sku": "A", "quantity": 1, "colour": "red"}]}, "unexpected property 'colour'"),
    ({"items": {"sku": "A", "quantity": 1}}, "arguments.items: expected array"),
    ({}, "missing required items"),
])
def test_validate(value, error):
    got = ts.validate(value, ORDER["parameters"])
    assert got == error if error is None else error in got


def test_validate_enum():
    assert "not one of" in ts.validate({"city": "Oslo", "unit": "kelvin"}, WEATHER["parameters"])


def test_validate_bool_is_not_in_an_integer_enum():
    """True == 1 in Python; in JSON Schema true is not one of [1] (the old validator let it pass)."""
    assert ts.validate(1, {"enum": [1]}) is None
    assert "True is not one of [1]" in ts.validate(True, {"enum": [1]})
    assert "not one of" in ts.validate(0, {"enum": [False]})


def test_validate_applies_schema_valued_additional_properties():
    """additionalProperties as a schema constrains the extra keys (the old validator ignored it)."""
    schema = {"type": "object", "properties": {"id": {"type": "string"}},
              "additionalProperties": {"type": "integer"}}
    assert ts.validate({"id": "x", "n": 3}, schema) is None
    assert ts.validate({"id": "x", "n": "3"}, schema) == "arguments.n: expected integer, got str"
    assert ts.validate({"id": 1}, schema) == "arguments.id: expected string, got int"


def test_schema_check_keeps_the_keyword_allow_list_at_every_depth():
    ok = {"type": "object", "properties": {"a": {"type": "string"}}, "additionalProperties": {"type": "integer"}}
    ts.check_schema(ok, where="t")
    with pytest.raises(LabkitError, match=r"t\.\*: unsupported schema keyword\(s\) \['pattern'\]"):
        ts.check_schema({**ok, "additionalProperties": {"type": "string", "pattern": "^x"}}, where="t")
    with pytest.raises(LabkitError, match="unsupported schema keyword"):
        ts.check_schema({"type": "object", "properties": {"a": {"minLength": 1}}}, where="t")
    with pytest.raises(LabkitError, match="not a valid JSON Schema"):
        ts.check_schema({"type": "object", "required": "a"}, where="t")


# --- scoring ------------------------------------------------------------------------

def fields(s: ts.TaskScore) -> tuple[bool, ...]:
    return s.parsed, s.valid, s.right_tool, s.right_args, s.correct


def test_right_answer():
    s = ts.score_task(task(), ' {"arguments": {"city": " Lisbon "}, "name": "get_weather"}')
    assert fields(s) == (True, True, True, True, True) and s.error is None


def test_default_valued_extra_argument_is_fine_but_other_values_are_not():
    assert ts.score_task(task(), '{"name": "get_weather", "arguments": {"city": "lisbon", "unit": "celsius"}}').correct
    s = ts.score_task(task(), '{"name": "get_weather", "arguments": {"city": "Lisbon", "unit": "fahrenheit"}}')
    assert fields(s) == (True, True, True, False, False)


def test_wrong_tool():
    t = task(category="choose", tools=(WEATHER, REFUND))
    s = ts.score_task(t, '{"name": "refund", "arguments": {"txn": "a", "amount": 1}}')
    assert fields(s) == (True, True, False, False, False)
    assert "expected 'get_weather'" in s.error


def test_unknown_tool_is_invalid():
    s = ts.score_task(task(), '{"name": "get_forecast", "arguments": {"city": "Lisbon"}}')
    assert fields(s) == (True, False, False, False, False)
    assert "not an offered tool" in s.error


def test_wrong_arguments():
    s = ts.score_task(task(), '{"name": "get_weather", "arguments": {"city": "Porto"}}')
    assert fields(s) == (True, True, True, False, False)
    assert "differ" in s.error


def test_bad_json():
    s = ts.score_task(task(), '{"name": "get_weather", "arguments": {"city": Lisbon}}')
    assert fields(s) == (False, False, False, False, False)
    assert s.error.startswith("invalid JSON")


def test_schema_violation_with_right_values_is_not_correct():
    t = task(category="nested", tools=(ORDER,),
             expected={"name": "place_order", "arguments": {"items": [{"sku": "A", "quantity": 2}]}})
    s = ts.score_task(t, '{"name": "place_order", "arguments": {"items": [{"sku": "A", "quantity": 2, "note": ""}]}}')
    assert fields(s) == (True, False, True, False, False)
    assert "unexpected property 'note'" in s.error


def test_call_needs_exactly_name_and_arguments():
    s = ts.score_task(task(), '{"name": "get_weather", "arguments": {"city": "Lisbon"}, "why": "rain"}')
    assert (s.valid, s.right_tool, s.correct) == (False, True, False)
    s = ts.score_task(task(), '{"name": "get_weather", "city": "Lisbon"}')
    assert (s.valid, s.right_args, s.correct) == (False, False, False)
    assert not ts.score_task(task(), '{"tool": "get_weather"}').valid


def test_numbers_compare_numerically_and_exact_strings_exactly():
    exp = {"name": "refund", "arguments": {"txn": "TX-9a", "amount": 40}}
    exact = task(category="exact", tools=(REFUND,), expected=exp)
    assert ts.score_task(exact, '{"name": "refund", "arguments": {"amount": 40.0, "txn": "TX-9a"}}').correct
    for wrong in ('"tx-9a"', '"TX-9a "', '"TX-9"'):
        s = ts.score_task(exact, f'{{"name": "refund", "arguments": {{"txn": {wrong}, "amount": 40}}}}')
        assert fields(s) == (True, True, True, False, False), wrong
    loose = task(category="single", tools=(REFUND,), expected=exp)
    assert ts.score_task(loose, '{"name": "refund", "arguments": {"txn": " tx-9a", "amount": 40}}').correct
    assert not ts.score_task(loose, '{"name": "refund", "arguments": {"txn": "TX-9a", "amount": 40.01}}').correct


def test_booleans_are_not_numbers():
    exp = {"name": "place_order", "arguments": {"items": [{"sku": "A", "quantity": 1}], "express": True}}
    t = task(category="nested", tools=(ORDER,), expected=exp)
    assert ts.score_task(t, json.dumps(exp)).correct
    s = ts.score_task(t, json.dumps({**exp, "arguments": {**exp["arguments"], "express": 1}}))
    assert (s.valid, s.right_args) == (False, False)


def test_array_order_matters():
    exp = {"name": "place_order", "arguments": {"items": [{"sku": "A", "quantity": 1}, {"sku": "B", "quantity": 2}]}}
    t = task(category="nested", tools=(ORDER,), expected=exp)
    swapped = {**exp, "arguments": {"items": exp["arguments"]["items"][::-1]}}
    assert not ts.score_task(t, json.dumps(swapped)).right_args


def test_none_category():
    t = task(category="none", expected={"name": None})
    assert fields(ts.score_task(t, ' {"name": null}')) == (True, True, True, True, True)
    assert ts.score_task(t, '{"name": null, "arguments": {}}').correct
    s = ts.score_task(t, '{"name": null, "arguments": {"city": "Lisbon"}}')
    assert (s.valid, s.correct) == (False, False)
    s = ts.score_task(t, '{"name": "get_weather", "arguments": {"city": "Lisbon"}}')
    assert fields(s) == (True, True, False, False, False)
    assert "expected None" in s.error


def test_null_call_on_a_tool_task_is_wrong_tool():
    s = ts.score_task(task(), '{"name": null}')
    assert fields(s) == (True, True, False, False, False)
    assert "answered no tool" in s.error


# --- summary ------------------------------------------------------------------------

def score(category, *flags) -> ts.TaskScore:
    return ts.TaskScore("x", category, *flags)


def test_summarize_arithmetic():
    scores = [
        score("single", True, True, True, True, True),
        score("single", True, True, True, False, False),
        score("none", True, True, True, True, True),
        score("exact", False, False, False, False, False),
    ]
    s = ts.summarize(scores)
    assert (s["n"], s["correct"], s["score"]) == (4, 2, 0.5)
    assert s["criteria"] == {"parsed": 0.75, "valid": 0.75, "right_tool": 0.75,
                             "right_args": 0.5, "correct": 0.5}
    assert s["categories"] == {
        "single": {"n": 2, "correct": 1, "score": 0.5},
        "exact": {"n": 1, "correct": 0, "score": 0.0},
        "none": {"n": 1, "correct": 1, "score": 1.0},
    }
    assert list(s["categories"]) == ["single", "exact", "none"]


def test_summarize_nothing_is_an_error():
    with pytest.raises(LabkitError, match="no task scores"):
        ts.summarize([])
