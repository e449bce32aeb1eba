"""The folder tree is the layer diagram: imports go downward only, and there is no cycle.

engines → artifacts → decoding → config → analysis → measure → suites → provenance →
report → lab (notebook API) → commands / cli. A module may import its own layer and the
layers below it; analysis, provenance and report never import an engine, the decoding
loop or a measurement (they read records, they do not make them).
"""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parents[1] / "src"

LAYERS = ["errors", "paths", "teardown", "engines", "artifacts", "decoding", "config", "analysis", "measure", "suites",
          "provenance", "report", "lab", "commands", "cli"]
RANK = {name: i for i, name in enumerate(LAYERS)}
RANK["paths"] = RANK["teardown"] = RANK["errors"]  # the three leaf helpers share layer 0
RANK["cli"] = RANK["commands"]
NEVER = {layer: {"engines", "decoding", "measure", "artifacts"} for layer in ("analysis", "provenance", "report")}


def module_name(path: Path) -> str:
    parts = list(path.relative_to(SRC).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def modules() -> dict[str, Path]:
    return {module_name(p): p for p in (SRC / "labkit").rglob("*.py")}


def _type_checking_lines(tree: ast.AST) -> set[int]:
    lines = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            for sub in ast.walk(node):
                if hasattr(sub, "lineno"):
                    lines.add(sub.lineno)
    return lines


def imports_of(name: str, path: Path, known: set[str]) -> set[str]:
    """labkit modules ``name`` imports anywhere in its body (lazy imports too)."""
    tree = ast.parse(path.read_text())
    skip = _type_checking_lines(tree)
    is_pkg = path.name == "__init__.py"
    out = set()
    for node in ast.walk(tree):
        if getattr(node, "lineno", None) in skip:
            continue
        if isinstance(node, ast.Import):
            out |= {a.name for a in node.names if a.name.startswith("labkit")}
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = name.split(".") if is_pkg else name.split(".")[:-1]
                base = base[: len(base) - (node.level - 1)]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            if not target.startswith("labkit"):
                continue
            for a in node.names:
                sub = f"{target}.{a.name}"
                out.add(sub if sub in known else target)
    return {m for m in out if m in known and m != name}


def layer(mod: str) -> str | None:
    parts = mod.split(".")
    return parts[1] if len(parts) > 1 else None


def graph() -> dict[str, set[str]]:
    mods = modules()
    return {name: imports_of(name, path, set(mods)) for name, path in mods.items()}


def violations(g: dict[str, set[str]]) -> list[str]:
    bad = []
    for mod, deps in g.items():
        lm = layer(mod)
        if lm is None:
            continue
        assert lm in RANK, f"{mod}: top-level {lm!r} is in no layer; add it to LAYERS in this test"
        for dep in deps:
            ld = layer(dep)
            if ld is None:
                continue
            if RANK[ld] > RANK[lm]:
                bad.append(f"{mod} ({lm}) imports {dep} ({ld}), a higher layer")
            if ld in NEVER.get(lm, ()):
                bad.append(f"{mod} ({lm}) imports {dep} ({ld}), which {lm} never does")
    return sorted(bad)


def cycles(g: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan)."""
    index, low, stack, on, out = {}, {}, [], set(), []
    counter = [0]

    def visit(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in g.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    sys.setrecursionlimit(10000)
    for v in g:
        if v not in index:
            visit(v)
    return out


def test_every_module_sits_in_a_layer_folder():
    top = {m for m in modules() if m.count(".") == 1}
    assert top <= {"labkit.errors", "labkit.paths", "labkit.cli"} | {f"labkit.{p}" for p in LAYERS}, top


def test_imports_go_downward_only():
    assert violations(graph()) == []


def test_no_import_cycle():
    assert cycles(graph()) == []


def test_checker_catches_an_upward_import_and_a_cycle():
    """The checks above can fail: a lower layer importing a higher one, and a cycle."""
    g = graph()
    g["labkit.engines.base"] = g["labkit.engines.base"] | {"labkit.report.figures"}
    assert any("labkit.engines.base (engines) imports labkit.report.figures" in v for v in violations(g))
    g["labkit.report.figures"] = g["labkit.report.figures"] | {"labkit.engines.base"}
    assert cycles(g)


@pytest.mark.parametrize("command", ["show", "regen", "advise", "worksheet"])
def test_read_only_commands_import_no_engine_or_matplotlib(command):
    """show/regen/advise/worksheet read the store; they load matplotlib or an engine only
    when they draw or decode."""
    code = (f"import sys, labkit.commands.{command}; "
            "bad = [m for m in ('matplotlib', 'llama_cpp', 'mlx', 'labkit.engines.llamacpp', 'labkit.decoding.loop') "
            "if m in sys.modules]; print(bad); sys.exit(1 if bad else 0)")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stdout + r.stderr
