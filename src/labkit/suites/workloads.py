"""Prompt workloads: named sets of completion prompts that stress speculation differently.

``edit`` asks the model to copy a passage with one change (prompt-lookup drafting's best
case), ``prose_en`` and ``prose_zh`` continue free text, ``code`` continues source, and
``tool_json`` continues a JSON tool call. Each lives in ``data/workloads/<name>.jsonl``,
one ``{"id", "prompt", "source", "note"}`` object per line.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from labkit.errors import LabkitError
from labkit.paths import data_dir

WORKLOADS = ("edit", "prose_en", "prose_zh", "code", "tool_json")
# SYNTHETIC: random token ids, for models without a tokenizer (the synthetic cost models);
# they price the steps (cost is real), their acceptance means nothing
SYNTHETIC_IDS = "synthetic_ids"
SYNTHETIC_PROMPT_TOKENS = 48
_REQUIRED = ("id", "prompt", "source")
_OPTIONAL = ("note",)


@dataclass(frozen=True)
class Prompt:
    """One completion prompt; ``text`` is fed to the model verbatim."""

    id: str
    workload: str
    text: str
    source: str
    note: str = ""
    ids: tuple[int, ...] | None = None  # token ids to feed as they are (SYNTHETIC prompts); None: tokenize text


def workload_path(name: str) -> Path:
    """Where the workload ``name`` is stored (the name is checked)."""
    if name not in WORKLOADS:
        raise LabkitError(f"unknown workload {name!r}", f"use one of {', '.join(WORKLOADS)}")
    return data_dir() / "workloads" / f"{name}.jsonl"


def _record(rec: object, *, workload: str, where: str) -> Prompt:
    if not isinstance(rec, dict):
        raise LabkitError(f"{where}: expected a JSON object",
                          'one object per line: {"id": ..., "prompt": ..., "source": ...}')
    missing = [k for k in _REQUIRED if k not in rec]
    unknown = sorted(set(rec) - set(_REQUIRED) - set(_OPTIONAL))
    if missing or unknown:
        raise LabkitError(
            f"{where}: missing keys {missing}, unknown keys {unknown}",
            f"each line needs {list(_REQUIRED)} and may have {list(_OPTIONAL)}",
        )
    for key in (*_REQUIRED, *_OPTIONAL):
        if key in rec and not isinstance(rec[key], str):
            raise LabkitError(f"{where}: {key!r} must be a string", f"quote the value of {key!r}")
    if not rec["prompt"].strip():
        raise LabkitError(f"{where}: the prompt is empty", "give the record a non-empty 'prompt'")
    return Prompt(id=rec["id"], workload=workload, text=rec["prompt"], source=rec["source"],
                  note=rec.get("note", ""))


def _read_jsonl(path: Path, *, workload: str, first_only: bool = False) -> list[Prompt]:
    prompts: list[Prompt] = []
    seen: set[str] = set()
    for lineno, line in enumerate(path.read_text(encoding="utf-8").splitlines(), start=1):
        if not line.strip():
            continue
        where = f"{path}:{lineno}"
        try:
            rec = json.loads(line)
        except json.JSONDecodeError as e:
            raise LabkitError(f"{where}: not valid JSON ({e.msg})", "one JSON object per line") from e
        prompt = _record(rec, workload=workload, where=where)
        if prompt.id in seen:
            raise LabkitError(f"{where}: duplicate prompt id {prompt.id!r}", "give each record a distinct 'id'")
        seen.add(prompt.id)
        prompts.append(prompt)
        if first_only:
            break
    if not prompts:
        raise LabkitError(f"{path} holds no prompts",
                          'add one JSON object per line: {"id": ..., "prompt": ..., "source": ...}')
    return prompts


def load_workload(name: str, *, limit: int | None = None) -> list[Prompt]:
    """The prompts of workload ``name`` in file order, the first ``limit`` if given."""
    path = workload_path(name)
    if limit is not None and limit < 1:
        raise LabkitError(f"limit must be at least 1, got {limit}", "use a limit of 1 or more, or none for all")
    if not path.is_file():
        raise LabkitError(f"workload file not found: {path}", "check the checkout's data/ folder")
    return _read_jsonl(path, workload=name)[:limit]


def load_prompt_file(path: str | Path) -> Prompt:
    """A user's own prompt: a ``.txt`` file is one prompt, verbatim (a trailing newline is
    kept, since it changes what the model sees); a ``.jsonl`` gives its first record."""
    path = Path(path)
    if not path.is_file():
        raise LabkitError(f"prompt file not found: {path}",
                          "check the path given to --prompt-file (relative paths start from the current directory)")
    if path.suffix == ".txt":
        text = path.read_text(encoding="utf-8")
        if not text.strip():
            raise LabkitError(f"{path}: the prompt file is empty",
                              "write the prompt into it (the whole file, verbatim, is the prompt)")
        return Prompt(id=path.stem, workload="file", text=text, source=str(path))
    if path.suffix == ".jsonl":
        return _read_jsonl(path, workload="file", first_only=True)[0]
    raise LabkitError(f"unsupported prompt file {path.name!r}",
                      "use a .txt file (one prompt) or a .jsonl file (its first record is used)")


def synthetic_prompts(n_vocab: int, *, n: int, seed: int = 0, length: int = SYNTHETIC_PROMPT_TOKENS) -> list[Prompt]:
    """``n`` SYNTHETIC prompts of random token ids in [0, n_vocab), seeded: cost only."""
    rng = np.random.default_rng(seed)
    return [Prompt(id=f"{SYNTHETIC_IDS}-{i + 1:02d}", workload=SYNTHETIC_IDS, text="",
                   source=f"SYNTHETIC: random token ids, seed {seed}", note="cost real, acceptance meaningless",
                   ids=tuple(int(t) for t in rng.integers(0, n_vocab, length))) for i in range(n)]


def require_prompts(workloads: list[str], limit: int | None, *, missing_ok: bool = False, reserve: int = 0) -> None:
    """Refuse a recipe that asks each workload for more prompts than its file holds (it
    would otherwise decide on fewer prompts than it says, silently). ``missing_ok``: a
    workload with no file is left to whoever loads it (a checkout root without data/, whose
    notebooks read no workload, runs; one that reads it is told there)."""
    if limit is None:
        return
    for w in workloads:
        if w == SYNTHETIC_IDS or (missing_ok and not workload_path(w).is_file()):
            continue
        n = len(load_workload(w))
        if n < limit + reserve:
            asked = (f"prompts_per_workload + reserve_prompts = {limit} + {reserve}" if reserve
                     else f"prompts_per_workload = {limit}")
            fix = (f"lower reserve_prompts to {n - limit} or less" if reserve and n >= limit
                   else f"lower prompts_per_workload + reserve_prompts to {n} or less (e.g. reserve_prompts: 0)"
                   if reserve else f"lower prompts_per_workload to {n} or less")
            raise LabkitError(
                f"{asked}, but workload {w!r} holds {n} prompts ({workload_path(w)})",
                f"{fix}, or add prompts to {workload_path(w).name} (one JSON object per line)")


def prompts_for(engine, workloads: list[str], *, limit: int | None = None, seed: int = 0) -> list[Prompt]:
    """The prompts of ``workloads`` for ``engine``: text workloads need a tokenizer;
    ``synthetic_ids`` gives SYNTHETIC token-id prompts (a model without a tokenizer needs them)."""
    require_prompts(workloads, limit)
    has_tok = getattr(engine, "has_tokenizer", True)
    out = []
    for w in workloads:
        if w == SYNTHETIC_IDS:
            out += synthetic_prompts(engine.n_vocab, n=limit or 1, seed=seed)
        elif not has_tok:
            raise LabkitError(f"workload {w!r} is text, but the model has no tokenizer (a SYNTHETIC model)",
                              f"use workloads: [{SYNTHETIC_IDS}] in the recipe for this model")
        else:
            out += load_workload(w, limit=limit)
    return out


def prompt_ids(engine, prompt: Prompt) -> list[int]:
    """What the model is fed: the prompt's own ids (SYNTHETIC), else its text tokenized."""
    return list(prompt.ids) if prompt.ids is not None else engine.tokenize(prompt.text)


def reserve_for(engine, workloads: list[str], *, after: int, n: int, seed: int = 0) -> list[Prompt]:
    """The search's reserve: per workload, the ``n`` prompts after its first ``after`` (the next
    ones in its file; for SYNTHETIC ids, the next ones of the same seeded stream), fixed before
    anything is measured. Empty for ``n`` = 0."""
    if n <= 0:
        return []
    first = {p.id for p in prompts_for(engine, workloads, limit=after, seed=seed)}
    return [p for p in prompts_for(engine, workloads, limit=after + n, seed=seed) if p.id not in first]


def all_workloads(*, limit: int | None = None) -> dict[str, list[Prompt]]:
    """Every workload by name, in ``WORKLOADS`` order."""
    return {name: load_workload(name, limit=limit) for name in WORKLOADS}
