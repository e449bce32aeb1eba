"""The tool-calling suite: load tasks, build few-shot completion prompts, score answers.

Answer convention, shared by prompt and scorer: the model writes one JSON object on one
line, ``{"name": <tool>, "arguments": {...}}``, or ``{"name": null}`` when no offered
tool fits (an ``"arguments"`` key is tolerated there only if empty). Generation stops at
``STOP``. Decoding is the caller's: render ``build_prompt(task)``, decode greedily until
``STOP`` with any engine, and hand the text to ``score_task``.
"""

from __future__ import annotations

import functools
import json
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

from labkit.errors import LabkitError
from labkit.paths import data_dir

CATEGORIES = ("single", "choose", "nested", "exact", "none")
CRITERIA = ("parsed", "valid", "right_tool", "right_args", "correct")
STOP = "\n"
MAX_TOKENS = 120  # the longest expected call in the suite is about 75 tokens
NULL_CALL = {"name": None}

# The JSON Schema keywords a tool's parameters may use; load_tasks refuses anything else
# so a schema never silently means more than the prompt shows the model. Validation
# itself is jsonschema's (Draft 2020-12): bool is not an integer (True is not in enum
# [1]) and a schema-valued additionalProperties is applied to the extra keys.
SCHEMA_KEYWORDS = frozenset({"type", "properties", "required", "items", "enum",
                             "additionalProperties", "description", "default"})
TYPES = ("object", "array", "string", "boolean", "null", "number", "integer")
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
        return "{" + _params(schema, quote=True) + "}"
    if schema.get("type") == "array":
        return "list of " + _type(schema.get("items", {}))
    t = schema.get("type", "any")
    return t if isinstance(t, str) else " | ".join(t)


def _params(schema: dict, *, quote: bool) -> str:
    parts = []
    for name, sub in schema.get("properties", {}).items():
        # Nested keys are shown quoted: the model copies keys into its JSON as shown.
        key = json.dumps(name) if quote else name
        text = f"{key}{'' if name in schema.get('required', []) else '?'}: {_type(sub)}"
        if "default" in sub:
            text += f" = {json.dumps(sub['default'], ensure_ascii=False)}"
        if "description" in sub:
            text += f" ({sub['description']})"
        parts.append(text)
    return ", ".join(parts)


def render_tool(tool: dict) -> str:
    """One line per tool, as a typed signature.

    Shown raw JSON Schema, the 270M base model echoed the schema back as its arguments
    (greedy score 0.04 on this suite, against about 0.3 with signatures).
    """
    return f"- {tool['name']}({_params(tool['parameters'], quote=False)}): {tool['description']}"


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

    ``examples`` defaults to ``data/toolsuite/examples.jsonl``, worked examples whose tools
    appear nowhere in the suite. Three of them decline: with one fewer the model declined
    on at most 1 of the 10 ``none`` tasks instead of 8.
    """
    if examples is None:
        examples = _examples(str(examples_path()))
    shots = [f"{_block(ex.tools, ex.request)} {json.dumps(ex.expected, ensure_ascii=False)}"
             for ex in examples]
    return "\n\n".join([_INTRO, *shots, _block(task.tools, task.request)])


# --- schema validation --------------------------------------------------------------

def _path(where: str, path) -> str:
    return where + "".join(f"[{p}]" if isinstance(p, int) else f".{p}" for p in path)


def _message(err, where: str) -> str:
    """One jsonschema error in the suite's words: where it is, and what was expected."""
    at = _path(where, err.absolute_path)
    kind, want, got = err.validator, err.validator_value, err.instance
    if kind == "type":
        types = [want] if isinstance(want, str) else list(want)
        return f"{at}: expected {'/'.join(types)}, got {type(got).__name__}"
    if kind == "enum":
        return f"{at}: {got!r} is not one of {want}"
    if kind == "required":
        return f"{at}: missing required {', '.join(k for k in want if k not in got)}"
    if kind == "additionalProperties" and want is False:
        extra = [k for k in got if k not in err.schema.get("properties", {})]
        return f"{at}: unexpected property {extra[0]!r}"
    return f"{at}: {err.message}"


@functools.lru_cache(maxsize=256)
def _validator(schema_json: str):
    from jsonschema import Draft202012Validator

    return Draft202012Validator(json.loads(schema_json))


def validate(value: object, schema: dict, *, where: str = "arguments") -> str | None:
    """The most relevant way ``value`` breaks ``schema`` (jsonschema, Draft 2020-12), else None."""
    from jsonschema.exceptions import best_match

    err = best_match(_validator(json.dumps(schema, sort_keys=True)).iter_errors(value))
    return None if err is None else _message(err, where)


def check_schema(schema: object, *, where: str) -> None:
    """Raise LabkitError if ``schema`` is not a valid JSON Schema or uses a keyword outside
    ``SCHEMA_KEYWORDS`` (at any depth, additionalProperties schemas included)."""
    from jsonschema import Draft202012Validator
    from jsonschema.exceptions import SchemaError

    _check_keywords(schema, where=where)
    try:
        Draft202012Validator.check_schema(schema)
    except SchemaError as e:
        raise LabkitError(f"{where}: not a valid JSON Schema: {e.message}",
                          "fix the schema (JSON Schema Draft 2020-12)") from None


def _check_keywords(schema: object, *, where: str) -> None:
    if not isinstance(schema, dict):
        raise LabkitError(f"{where}: a schema must be a JSON object")
    unknown = set(schema) - SCHEMA_KEYWORDS
    if unknown:
        raise LabkitError(f"{where}: unsupported schema keyword(s) {sorted(unknown)}",
                          f"use only {sorted(SCHEMA_KEYWORDS)}")
    types = schema.get("type", [])
    for t in [types] if isinstance(types, str) else types:
        if t not in TYPES:
            raise LabkitError(f"{where}: unknown type {t!r}", f"use one of {list(TYPES)}")
    for key, sub in schema.get("properties", {}).items():
        _check_keywords(sub, where=f"{where}.{key}")
    if "items" in schema:
        _check_keywords(schema["items"], where=f"{where}[]")
    if isinstance(schema.get("additionalProperties"), dict):
        _check_keywords(schema["additionalProperties"], where=f"{where}.*")


# --- loading ------------------------------------------------------------------------

def default_path() -> Path:
    """The shipped suite, ``data/toolsuite/tasks.jsonl``."""
    return data_dir() / "toolsuite" / "tasks.jsonl"


def _parse_task(rec: object, where: str) -> Task:
    if not isinstance(rec, dict):
        raise LabkitError(f"{where}: a task must be a JSON object")
    missing, unknown = sorted((_TASK_KEYS - {"note"}) - set(rec)), sorted(set(rec) - _TASK_KEYS)
    if missing or unknown:
        raise LabkitError(f"{where}: missing keys {missing}, unknown keys {unknown}",
                          f"a task has exactly the keys {sorted(_TASK_KEYS)} (note is optional)")
    if not all(isinstance(rec.get(k, ""), str) for k in ("id", "request", "note")):
        raise LabkitError(f"{where}: id, request and note must be strings")
    if rec["category"] not in CATEGORIES:
        raise LabkitError(f"{where}: unknown category {rec['category']!r}",
                          f"use one of {list(CATEGORIES)}")
    tools = rec["tools"]
    if not isinstance(tools, list) or not tools:
        raise LabkitError(f"{where}: 'tools' must be a non-empty list")
    for i, t in enumerate(tools):
        if not isinstance(t, dict) or set(t) != {"name", "description", "parameters"}:
            raise LabkitError(f"{where}: tool {i} must have exactly name, description, parameters")
        if not isinstance(t["parameters"], dict) or t["parameters"].get("type") != "object":
            raise LabkitError(f"{where}: parameters of tool {t['name']!r} must be of type object")
        check_schema(t["parameters"], where=f"{where}: {t['name']}")
    names = [t["name"] for t in tools]
    if len(set(names)) != len(names):
        raise LabkitError(f"{where}: duplicate tool names in {names}")
    if rec["category"] == "choose" and len(tools) < 2:
        raise LabkitError(f"{where}: a 'choose' task must offer at least two tools")
    task = Task(id=rec["id"], category=rec["category"], tools=tuple(tools),
                request=rec["request"], expected=rec["expected"], note=rec.get("note", ""))
    exp = task.expected
    if task.category == "none" or exp == NULL_CALL:
        if task.category != "none" or exp != NULL_CALL:
            raise LabkitError(f"{where}: expected {{\"name\": null}} goes with category 'none' only",
                              "use category 'none' exactly when no tool applies")
        return task
    if not isinstance(exp, dict) or set(exp) != {"name", "arguments"}:
        raise LabkitError(f"{where}: 'expected' must be {{\"name\": ..., \"arguments\": {{...}}}}")
    tool = task.tool(exp["name"])
    if tool is None:
        raise LabkitError(f"{where}: expected tool {exp['name']!r} is not among the task's tools",
                          f"offer it or pick one of {names}")
    err = validate(exp["arguments"], tool["parameters"])
    if err:
        raise LabkitError(f"{where}: expected arguments break the tool's schema: {err}")
    return task


def load_tasks(path: str | Path | None = None) -> list[Task]:
    """Read and validate a task file (default: the shipped suite, ``default_path()``)."""
    path = Path(path) if path is not None else default_path()
    if not path.is_file():
        raise LabkitError(f"tool-suite file not found: {path}", "check the path or data/toolsuite/")
    tasks: dict[str, Task] = {}
    for lineno, line in enumerate(path.read_text(encoding="utf-8").splitlines(), start=1):
        if not line.strip():
            continue
        where = f"{path}:{lineno}"
        try:
            task = _parse_task(json.loads(line), where)
        except json.JSONDecodeError as e:
            raise LabkitError(f"{where}: not valid JSON ({e.msg})", "one JSON object per line") from e
        if task.id in tasks:
            raise LabkitError(f"{where}: duplicate task id {task.id!r}")
        tasks[task.id] = task
    if not tasks:
        raise LabkitError(f"{path} holds no tasks")
    return list(tasks.values())


# --- scoring ------------------------------------------------------------------------

class _DuplicateKey(ValueError):
    pass


def _no_duplicates(pairs: list[tuple[str, object]]) -> dict:
    # json.loads keeps the last of repeated keys; an answer that says two things at once
    # must not be scored on whichever came last.
    counts = Counter(k for k, _ in pairs)
    if len(counts) != len(pairs):
        raise _DuplicateKey(f"duplicate key {next(k for k, n in counts.items() if n > 1)!r}")
    return dict(pairs)


_DECODER = json.JSONDecoder(object_pairs_hook=_no_duplicates)


def extract_call(text: str) -> tuple[dict | None, str | None]:
    """The first JSON object in ``text`` and None, or None and why there is none.

    Text after the object is ignored; repeated keys make the object unparseable."""
    start = text.find("{")
    if start < 0:
        return None, "no JSON object in output"
    try:
        return _DECODER.raw_decode(text, start)[0], None
    except json.JSONDecodeError as e:
        return None, f"invalid JSON: {e.msg}"
    except _DuplicateKey as e:
        return None, f"invalid JSON: {e}"


def _same(got: object, want: object, *, exact: bool) -> bool:
    """Normalised equality: key order ignored, 3 == 3.0, strings stripped and casefolded
    unless ``exact``; booleans never equal numbers; list order matters."""
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
    """Score the text generated for ``task`` under the module's answer convention.

    ``valid``: the call is well formed, names an offered tool, and its arguments satisfy
    that tool's schema. ``right_args``: equal to the expected arguments after ``_same``'s
    normalisation (strings exact in the ``exact`` category), ignoring extra optional
    arguments given at their schema default.
    """
    call, err = extract_call(output_text)

    def result(valid: bool, right_tool: bool, right_args: bool, error: str | None) -> TaskScore:
        correct = valid and right_tool and right_args
        return TaskScore(task.id, task.category, call is not None, valid, right_tool, right_args,
                         correct, None if correct else error)

    if call is None:
        return result(False, False, False, err)
    if "name" not in call:
        return result(False, False, False, 'the JSON is not a call: it needs a "name" key')
    name, want = call["name"], task.expected["name"]
    if name is None:
        valid = set(call) <= {"name", "arguments"} and call.get("arguments", {}) == {}
        return result(valid, want is None, want is None and valid,
                      f"answered no tool, expected {want!r}" if valid
                      else 'a null call is {"name": null} and nothing else')
    args = call.get("arguments")
    tool = task.tool(name) if isinstance(name, str) else None
    if tool is None:
        err = f"{name!r} is not an offered tool"
    elif set(call) != {"name", "arguments"} or not isinstance(args, dict):
        err = 'a call is {"name": ..., "arguments": {...}} and nothing else'
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
    by_cat = {}
    for cat in CATEGORIES:
        mine = [s for s in scores if s.category == cat]
        if mine:
            k = sum(s.correct for s in mine)
            by_cat[cat] = {"n": len(mine), "correct": k, "score": k / len(mine)}
    n, correct = len(scores), sum(s.correct for s in scores)
    return {
        "n": n,
        "correct": correct,
        "score": correct / n,
        "criteria": {c: sum(getattr(s, c) for s in scores) / n for c in CRITERIA},
        "categories": by_cat,
    }
