"""The tool suite as a protocol criterion: is the suite still inside its noise band at k?

The n_max protocol checks the product suite at every step it would keep. A full
control (``qc.control``, notebook 04) is too dear to repeat per step, so this runs a
small, category-spread subset: the sampled off runs once (they set the band, whatever
k is), then the same seeds with speculation on at each k asked for, judged by
``qc.verdict``. Greedy runs are left to notebook 04: greedy speculation is lossless,
so only sampled runs can show a behavioural shift.
"""

from __future__ import annotations

from collections.abc import Callable

import pandas as pd

from labkit.suites import qc, toolsuite


def spread_tasks(tasks: list, n: int | None) -> list:
    """``n`` tasks spread over the suite (every len/n-th), so each category is likely in."""
    if n is None or n >= len(tasks):
        return list(tasks)
    stride = len(tasks) / n
    return [tasks[int(i * stride)] for i in range(n)]


class SuiteCheck:
    """``check(drafter, k) -> verdict`` for ``measure.protocol.stepwise``."""

    def __init__(self, engine, *, drafters: dict, n_tasks: int | None, runs: int, temperature: float,
                 seed: int = 0, progress: Callable | None = None):
        self.engine, self.drafters, self.runs = engine, drafters, runs
        self.temperature, self.seed = temperature, seed
        self.say = progress or (lambda _m: None)
        self.skipped = None
        if not getattr(engine, "has_tokenizer", True):
            self.skipped = "the model has no tokenizer (a SYNTHETIC model): the tool suite needs a real vocabulary"
        elif not n_tasks:
            self.skipped = "protocol_toolsuite_tasks = 0 in the recipe"
        elif temperature <= 0:
            self.skipped = "toolsuite_temperature is 0: greedy speculation is lossless, a band needs sampled runs"
        self.tasks = [] if self.skipped else spread_tasks(toolsuite.load_tasks(), n_tasks)
        self._off: list[float] | None = None
        self.results: list[dict] = []

    @classmethod
    def from_recipe(cls, engine, drafters: dict, recipe, *, progress: Callable | None = None) -> SuiteCheck:
        """The recipe's check: ``protocol_toolsuite_tasks`` tasks (at most ``toolsuite_tasks``
        when that is set), ``toolsuite_runs`` sampled runs at ``toolsuite_temperature``."""
        n = recipe.protocol_toolsuite_tasks
        if recipe.toolsuite_tasks is not None:
            n = min(n, recipe.toolsuite_tasks)
        return cls(engine, drafters=drafters, n_tasks=n, runs=recipe.toolsuite_runs,
                   temperature=recipe.toolsuite_temperature, seed=recipe.seed, progress=progress)

    def _blocks(self, drafter=None, k: int = 0) -> list[qc.Block]:
        return [qc.Block(drafter, k, self.temperature, qc.run_seed(self.seed, self.temperature, r))
                for r in range(self.runs)]

    def __call__(self, drafter: str, k: int) -> dict:
        if self.skipped:
            return {"skipped": self.skipped}
        blocks = self._blocks(self.drafters[drafter], k)
        if self._off is None:  # the off runs with the first check, task by task (each prompt computed once)
            self.say(f"protocol suite check: {len(self.tasks)} tasks x {self.runs} runs, speculation off, "
                     f"and {drafter} k={k}")
            res = qc.run_blocks(self.engine, self.tasks, self._blocks() + blocks)
            self._off = [r["summary"]["score"] for r in res[: self.runs]]
            runs = res[self.runs :]
        else:
            self.say(f"protocol suite check: {drafter} k={k}")
            runs = qc.run_blocks(self.engine, self.tasks, blocks)
        on = [r["summary"]["score"] for r in runs]
        acc = pd.concat([r["rows"]["acceptance"] for r in runs]).dropna()
        v = {**qc.verdict(self._off, on), "drafter": drafter, "k": k, "tasks": len(self.tasks),
             "off_scores": list(self._off), "on_scores": on,
             "on_acceptance": float(acc.median()) if len(acc) else None}
        self.results.append(v)
        return v
