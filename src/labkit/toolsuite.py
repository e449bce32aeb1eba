"""The tool-calling suite: load the tasks, build few-shot completion prompts, score answers.

The answer convention, shared by the prompt and the scorer: the model writes one JSON
object on one line, ``{"name": <tool>, "arguments": {...}}``. When no offered tool fits
the request it writes ``{"name": null}`` (an ``"arguments"`` key is tolerated there only
if it is an empty object). Generation stops at ``STOP``, the end of that line.

Generation itself is not done here: a caller renders ``build_prompt(task)``, decodes
until ``STOP`` with any engine, and hands the text to ``score_task``.
"""

from __future__ import annotations

import functools
import json
from dataclasses import dataclass
from pathlib import Path

from labkit.errors import LabkitError
from labkit.paths import data_dir

CATEGORIES = ("single", "choose", "nested", "exact", "none")
CRITERIA = ("parsed", "valid", "right_tool", "right_args", "correct")
STOP = "\n"
MAX_TOKENS = 120  # the longest expected call in the suite is ~70 tokens
NULL_CALL = {"name": None}

# The JSON Schema subset the validator understands; load_tasks rejects anything else so
# that a schema never silently means more than the scorer checks.
SCHEMA_KEYWORDS = frozenset(
    {"type", "properties", "required", "items", "enum", "additionalProperties",
     "description", "default"}
)
_TYPES = ("object", "array", "string", "number", "integer", "boolean", "null")

_TASK_KEYS = {"id", "category", "tools", "request", "expected", "note"}


@dataclass(frozen=True)
class Task:
    """One request, the tools offered with it, and the call a correct answer makes."""

    id: str
    category: str
    tools: tuple[dict, ...]
    request: str
    expected: dict
    note: str = ""

    def tool(self, name: str) -> dict | None:
        """The offered tool called ``name``, or None."""
        return next((t for t in self.tools if t["name"] == name), None)


@dataclass(frozen=True)
class TaskScore:
    """How one answer fared; ``correct`` is the headline, the rest say where it failed."""

    id: str
    category: str
    parsed: bool
    valid: bool
    right_tool: bool
    right_args: bool
    correct: bool
    error: str | None = None


# --- prompt -------------------------------------------------------------------------

_INTRO = (
    "Each request below is answered by calling one of the listed tools. The answer is one "
    'line of JSON: {"name": <tool name>, "arguments": {<arguments>}}, copying names, '
    'numbers and IDs exactly from the request. If no tool fits, the answer is {"name": null}. '
    "Use only the argument names listed for the tool."
)


def _type(schema: dict) -> str:
    if "enum" in schema:
        return " | ".join(json.dumps(v, ensure_ascii=False) for v in schema["enum"])
    if "properties" in schema:
        return "{" + ", ".join(_param(k, sub, schema, quote=True)
                               for k, sub in schema["properties"].items()) + "}"
    if schema.get("type") == "array":
        return "list of " + _type(schema.get("items", {}))
    t = schema.get("type", "any")
    return t if isinstance(t, str) else " | ".join(t)


def _param(name: str, sub: dict, parent: dict, *, quote: bool) -> str:
    # Nested keys are shown quoted because the model copies them into its JSON as shown.
    key = json.dumps(name) if quote else name
    optional = "" if name in parent.get("required", []) else "?"
    text = f"{key}{optional}: {_type(sub)}"
    if "default" in sub:
        text += f" = {json.dumps(sub['default'], ensure_ascii=False)}"
    if "description" in sub:
        text += f" ({sub['description']})"
    return text


def render_tool(tool: dict) -> str:
    """One line per tool, as a typed signature.

    Raw JSON Schema is what the 270M base model was worst at: it echoed the schema back
    as the arguments (greedy score 0.04 against ~0.3 for signatures on the same tasks).
    """
    params = tool["parameters"]
    args = ", ".join(_param(k, sub, params, quote=False) for k, sub in params["properties"].items())
    return f"- {tool['name']}({args}): {tool['description']}"


def _block(tools: tuple[dict, ...], request: str) -> str:
    return "\n".join(["Tools:", *(render_tool(t) for t in tools), f"Request: {request}", "Call:"])


def examples_path() -> Path:
    """The shipped few-shot examples, ``data/toolsuite/examples.jsonl``."""
    return data_dir() / "toolsuite" / "examples.jsonl"


@functools.lru_cache(maxsize=4)
def _examples(path: str) -> tuple[Task, ...]:
    return tuple(load_tasks(path))


def build_prompt(task: Task, *, examples: list[Task] | None = None) -> str:
    """The few-shot completion prompt for ``task``; the model continues after ``Call:``.

    ``examples`` defaults to ``data/toolsuite/examples.jsonl``: worked examples whose
    tools appear nowhere in the suite (a test checks), three of which decline, since a
    small model shown none calls some tool for every request.
    """
    if examples is None:
        examples = _examples(str(examples_path()))
    shots = [f"{_block(ex.tools, ex.request)} {json.dumps(ex.expected, ensure_ascii=False)}"
             for ex in examples]
    return "\n\n".join([_INTRO, *shots, _block(task.tools, task.request)])


# --- schema validation --------------------------------------------------------------

def _is_type(value: object, type_: str) -> bool:
    if type_ == "integer":
        # JSON does not tell 3 from 3.0 apart in meaning; JSON Schema accepts both.
        return (isinstance(value, int) and not isinstance(value, bool)) or (
            isinstance(value, float) and value.is_integer())
    if type_ == "number":
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    expected = {"object": dict, "array": list, "string": str, "boolean": bool,
                "null": type(None)}[type_]
    return isinstance(value, expected)


def validate(value: object, schema: dict, *, where: str = "arguments") -> str | None:
    """The first way ``value`` breaks ``schema`` (the ``SCHEMA_KEYWORDS`` subset), else None."""
    types = schema.get("type")
    if types is not None:
        types = [types] if isinstance(types, str) else types
        if not any(_is_type(value, t) for t in types):
            return f"{where}: expected {'/'.join(types)}, got {type(value).__name__}"
    if "enum" in schema and value not in schema["enum"]:
        return f"{where}: {value!r} is not one of {schema['enum']}"
    if isinstance(value, dict):
        props = schema.get("properties", {})
        missing = [k for k in schema.get("required", []) if k not in value]
        if missing:
            return f"{where}: missing required {', '.join(missing)}"
        for key, item in value.items():
            if key in props:
                err = validate(item, props[key], where=f"{where}.{key}")
                if err:
                    return err
            elif schema.get("additionalProperties", True) is False:
                return f"{where}: unexpected property {key!r}"
    if isinstance(value, list) and "items" in schema:
        for i, item in enumerate(value):
            err = validate(item, schema["items"], where=f"{where}[{i}]")
            if err:
                return err
    return None


def check_schema(schema: object, *, where: str) -> None:
    """Raise LabkitError if ``schema`` uses anything the validator does not implement."""
    if not isinstance(schema, dict):
        raise LabkitError(f"{where}: a schema must be a JSON object")
    unknown = set(schema) - SCHEMA_KEYWORDS
    if unknown:
        raise LabkitError(f"{where}: unsupported schema keyword(s) {sorted(unknown)}",
                          f"use only {sorted(SCHEMA_KEYWORDS)}")
    types = schema.get("type", [])
    for t in [types] if isinstance(types, str) else types:
        if t not in _TYPES:
            raise LabkitError(f"{where}: unknown type {t!r}", f"use one of {list(_TYPES)}")
    for key, sub in schema.get("properties", {}).items():
        check_schema(sub, where=f"{where}.{key}")
    if "items" in schema:
        check_schema(schema["items"], where=f"{where}[]")


# --- loading ------------------------------------------------------------------------

def default_path() -> Path:
    """The shipped suite, ``data/toolsuite/tasks.jsonl``."""
    return data_dir() / "toolsuite" / "tasks.jsonl"


def _parse_task(rec: object, where: str) -> Task:
    if not isinstance(rec, dict):
        raise LabkitError(f"{where}: a task must be a JSON object")
    missing = (_TASK_KEYS - {"note"}) - set(rec)
    unknown = set(rec) - _TASK_KEYS
    if missing or unknown:
        raise LabkitError(f"{where}: missing keys {sorted(missing)}, unknown keys {sorted(unknown)}",
                          f"a task has exactly the keys {sorted(_TASK_KEYS)} (note is optional)")
    if rec["category"] not in CATEGORIES:
        raise LabkitError(f"{where}: unknown category {rec['category']!r}",
                          f"use one of {list(CATEGORIES)}")
    tools = rec["tools"]
    if not isinstance(tools, list) or not tools:
        raise LabkitError(f"{where}: 'tools' must be a non-empty list")
    for i, t in enumerate(tools):
        if not isinstance(t, dict) or set(t) != {"name", "description", "parameters"}:
            raise LabkitError(f"{where}: tool {i} must have exactly name, description, parameters")
        if t["parameters"].get("type") != "object":
            raise LabkitError(f"{where}: parameters of tool {t['name']!r} must be of type object")
        check_schema(t["parameters"], where=f"{where}: {t['name']}")
    names = [t["name"] for t in tools]
    if len(set(names)) != len(names):
        raise LabkitError(f"{where}: duplicate tool names in {names}")
    if rec["category"] == "choose" and len(tools) < 2:
        raise LabkitError(f"{where}: a 'choose' task must offer at least two tools")
    task = Task(id=rec["id"], category=rec["category"], tools=tuple(tools),
                request=rec["request"], expected=rec["expected"], note=rec.get("note", ""))
    _check_expected(task, where)
    return task


def _check_expected(task: Task, where: str) -> None:
    exp = task.expected
    if task.category == "none" or exp == NULL_CALL:
        if task.category != "none" or exp != NULL_CALL:
            raise LabkitError(f"{where}: expected {{\"name\": null}} goes with category 'none' only",
                              "use category 'none' exactly when no tool applies")
        return
    if not isinstance(exp, dict) or set(exp) != {"name", "arguments"}:
        raise LabkitError(f"{where}: 'expected' must be {{\"name\": ..., \"arguments\": {{...}}}}")
    tool = task.tool(exp["name"])
    if tool is None:
        raise LabkitError(f"{where}: expected tool {exp['name']!r} is not among the task's tools",
                          f"offer it or pick one of {[t['name'] for t in task.tools]}")
    err = validate(exp["arguments"], tool["parameters"])
    if err:
        raise LabkitError(f"{where}: expected arguments break the tool's schema: {err}")


def load_tasks(path: str | Path | None = None) -> list[Task]:
    """Read and validate the suite (default ``data/toolsuite/tasks.jsonl``)."""
    path = Path(path) if path is not None else default_path()
    if not path.is_file():
        raise LabkitError(f"tool-suite file not found: {path}", "check the path or the checkout's data/ folder")
    tasks: list[Task] = []
    seen: set[str] = set()
    for lineno, line in enumerate(path.read_text(encoding="utf-8").splitlines(), start=1):
        if not line.strip():
            continue
        where = f"{path}:{lineno}"
        try:
            rec = json.loads(line)
        except json.JSONDecodeError as e:
            raise LabkitError(f"{where}: not valid JSON ({e.msg})", "one JSON object per line") from e
        task = _parse_task(rec, where)
        if task.id in seen:
            raise LabkitError(f"{where}: duplicate task id {task.id!r}")
        seen.add(task.id)
        tasks.append(task)
    if not tasks:
        raise LabkitError(f"{path} holds no tasks")
    return tasks


# --- scoring ------------------------------------------------------------------------

class _DuplicateKey(ValueError):
    pass


def _no_duplicates(pairs: list[tuple[str, object]]) -> dict:
    # json.loads keeps the last of repeated keys; an answer that says two things at once
    # must not be scored on whichever came last.
    obj = dict(pairs)
    if len(obj) != len(pairs):
        seen: set[str] = set()
        dup = next(k for k, _ in pairs if k in seen or seen.add(k))
        raise _DuplicateKey(f"duplicate key {dup!r}")
    return obj


_DECODER = json.JSONDecoder(object_pairs_hook=_no_duplicates)


def extract_call(text: str) -> tuple[dict | None, str | None]:
    """The first JSON object in ``text`` and None, or None and why there is none.

    Text after the object is ignored; repeated keys make the object unparseable."""
    start = text.find("{")
    if start < 0:
        return None, "no JSON object in output"
    try:
        obj, _ = _DECODER.raw_decode(text, start)
    except json.JSONDecodeError as e:
        return None, f"invalid JSON: {e.msg}"
    except _DuplicateKey as e:
        return None, f"invalid JSON: {e}"
    return obj, None


def _same(got: object, want: object, *, exact: bool) -> bool:
    """Normalised equality: key order ignored, 3 == 3.0, strings stripped and casefolded
    unless ``exact``; booleans never equal numbers."""
    if isinstance(got, bool) or isinstance(want, bool):
        return type(got) is type(want) and got == want
    if isinstance(got, (int, float)) and isinstance(want, (int, float)):
        return float(got) == float(want)
    if isinstance(got, str) and isinstance(want, str):
        return got == want if exact else got.strip().casefold() == want.strip().casefold()
    if isinstance(got, dict) and isinstance(want, dict):
        return got.keys() == want.keys() and all(_same(got[k], want[k], exact=exact) for k in want)
    if isinstance(got, list) and isinstance(want, list):
        return len(got) == len(want) and all(_same(g, w, exact=exact) for g, w in zip(got, want))
    return got is None and want is None


def _drop_defaults(args: dict, expected: dict, schema: dict) -> dict:
    # Spelling out an optional argument at its documented default is not a mistake.
    props = schema.get("properties", {})
    return {k: v for k, v in args.items()
            if k in expected or "default" not in props.get(k, {}) or v != props[k]["default"]}


def score_task(task: Task, output_text: str) -> TaskScore:
    """Score the generated text for ``task`` (see the module docstring for the convention)."""
    call, err = extract_call(output_text)

    def result(valid: bool, right_tool: bool, right_args: bool, error: str | None) -> TaskScore:
        correct = valid and right_tool and right_args
        return TaskScore(task.id, task.category, call is not None, valid, right_tool, right_args,
                         correct, None if correct else error)

    if call is None:
        return result(False, False, False, err)
    if not isinstance(call, dict) or "name" not in call:
        return result(False, False, False, 'the JSON is not a call: it needs a "name" key')
    name, want = call["name"], task.expected["name"]
    if name is None:
        valid = set(call) <= {"name", "arguments"} and call.get("arguments", {}) == {}
        ok = want is None
        return result(valid, ok, ok, "a null call takes no arguments" if not valid
                      else f"answered no tool, expected {want!r}")
    args = call.get("arguments")
    tool = task.tool(name) if isinstance(name, str) else None
    if tool is None:
        valid, err = False, f"{name!r} is not an offered tool"
    elif set(call) != {"name", "arguments"} or not isinstance(args, dict):
        valid, err = False, 'a call is {"name": ..., "arguments": {...}} and nothing else'
    else:
        err = validate(args, tool["parameters"])
        valid = err is None
    right_tool = name == want
    right_args = right_tool and isinstance(args, dict) and _same(
        _drop_defaults(args, task.expected["arguments"], tool["parameters"]),
        task.expected["arguments"], exact=task.category == "exact")
    if err is None:
        err = (f"called {name!r}, expected {want!r}" if not right_tool
               else f"arguments {json.dumps(args)} differ from {json.dumps(task.expected['arguments'])}")
    return result(valid, right_tool, right_args, err)


def summarize(scores: list[TaskScore]) -> dict:
    """Overall score (fraction correct), per-criterion and per-category fractions, counts."""
    if not scores:
        raise LabkitError("no task scores to summarize", "score at least one task first")
    n = len(scores)
    by_cat: dict[str, dict] = {}
    for cat in CATEGORIES:
        mine = [s for s in scores if s.category == cat]
        if mine:
            k = sum(s.correct for s in mine)
            by_cat[cat] = {"n": len(mine), "correct": k, "score": k / len(mine)}
    correct = sum(s.correct for s in scores)
    return {
        "n": n,
        "correct": correct,
        "score": correct / n,
        "criteria": {c: sum(getattr(s, c) for s in scores) / n for c in CRITERIA},
        "categories": by_cat,
    }
