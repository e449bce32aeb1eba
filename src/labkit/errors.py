"""One error type for problems a user can act on: it names the problem and the fix."""

from __future__ import annotations


class LabkitError(Exception):
    """A user-facing error: ``problem`` says what is wrong, ``fix`` what to do about it."""

    def __init__(self, problem: str, fix: str | None = None):
        self.problem = problem
        self.fix = fix
        super().__init__(problem if fix is None else f"{problem}\n  fix: {fix}")


def missing_extra(module: str, extra: str) -> LabkitError:
    """The error for an optional dependency that is not installed (papermill's style)."""
    return LabkitError(
        f"the optional dependency {module!r} is not installed",
        f"pip install 'labkit[{extra}]'",
    )
