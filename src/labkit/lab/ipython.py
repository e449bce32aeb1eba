"""The kernel side of a notebook session: IPython's history (which names a cell
assigned, for the parameters), and display helpers that degrade to nothing outside a kernel.
"""

from __future__ import annotations

import ast
import json


def _assigned_names(source: str) -> list[str]:
    try:
        tree = ast.parse(source)
    except SyntaxError:
        return []
    names = []
    for node in tree.body:
        targets = node.targets if isinstance(node, ast.Assign) else [node.target] if isinstance(node, ast.AnnAssign) else []
        names += [t.id for t in targets if isinstance(t, ast.Name)]
    return names


def _display(obj) -> None:
    try:
        from IPython.display import display

        display(obj)
    except ImportError:
        pass


def _display_md(text: str) -> None:
    try:
        from IPython.display import Markdown, display

        display(Markdown(text))
    except ImportError:
        pass


def _jsonable(v) -> bool:
    try:
        json.dumps(v)
        return True
    except (TypeError, ValueError):
        return False


def _ipython():
    try:
        from IPython import get_ipython

        return get_ipython()
    except ImportError:
        return None
