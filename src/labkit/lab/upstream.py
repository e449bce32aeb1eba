"""Which upstream run a downstream notebook reads, chosen as someone working in JupyterLab expects.

03, 05 and 06 read the k sweep of ``02_k_sweep``. Under ``labkit reproduce`` the recipe
rule decides (``report.queries.source_run``: the newest finished sweep with this recipe's
sweep fields, else of the same recipe name), which is what makes a reproduction
reproducible. Interactively that rule surprises: run 02 with smaller parameters, then
03, and 03 reads the last *reproduction*, not the 02 just run. So an interactive
downstream notebook whose parameters name no run (``sweep = None``) takes, in order:

1. the newest finished upstream run of the same JupyterLab session (the server process:
   ``LABKIT_JUPYTER_SESSION``, set by ``jupyter-config/jupyter_server_config.py``; a
   server started without that config is told apart by the kernel's parent process);
2. else the newest finished interactive upstream run of the same user (``lab.user``) for
   this recipe name on this host;
3. else the recipe rule.

The choice becomes the recipe's ``sweep`` field (so every reader, ``source_run``,
``advise``, the worksheet, reads that run), recorded with its reason as the field's origin
and the ``lab.source_rule`` tag, and said in the notebook's first output line together with
the one line that picks another run.
"""

from __future__ import annotations

import getpass
import os
import socket
from dataclasses import dataclass

from labkit.errors import LabkitError
from labkit.provenance import tracking
from labkit.report import queries

# downstream notebook -> the notebook whose run it reads
UPSTREAM = {"03_acceptance_by_position": "02_k_sweep", "05_power": "02_k_sweep", "06_results_matrix": "02_k_sweep"}
SESSION_TAG = "lab.jupyter_session"
USER_TAG = "lab.user"
SESSION_ENV = "LABKIT_JUPYTER_SESSION"


def jupyter_session() -> str | None:
    """This kernel's JupyterLab session (its server), or None outside a Jupyter server."""
    if os.environ.get(SESSION_ENV):
        return os.environ[SESSION_ENV]
    if os.environ.get("JPY_SESSION_NAME"):  # a server started without the project's config
        return f"{socket.gethostname()}:server-pid-{os.getppid()}"
    return None


def user() -> str:
    try:
        return getpass.getuser()
    except (KeyError, OSError):
        return str(os.getuid())


@dataclass(frozen=True)
class Choice:
    upstream: str  # the notebook read, "02_k_sweep"
    lab_id: str | None  # the run chosen here; None: the recipe rule decides (see `line`)
    why: str  # the rule that chose it, as said to the user

    def line(self, c, recipe) -> str:
        """The notebook's first output line: which run, why, and how to pick another."""
        lab_id, why = self.lab_id, self.why
        if lab_id is None:  # say which run the recipe rule gives, when there is one
            try:
                _, lab_id = queries.source_run(c, self.upstream, recipe)
            except LabkitError:
                return (f"Reads {self.upstream}: none found yet for recipe `{recipe.name}` ({why}). "
                        f"Run {self.upstream} first, or set `sweep = \"LAB:…\"` in the parameters cell.")
        return (f"Reads {self.upstream} run `[{lab_id}]`: {why}. "
                f"To read another: set `sweep = \"LAB:…\"` in the parameters cell (`labkit show` lists runs).")


def choose(c, *, notebook: str, recipe, interactive: bool) -> Choice | None:
    """The upstream run for ``notebook`` (None when it reads none)."""
    upstream = UPSTREAM.get(notebook)
    if upstream is None:
        return None
    if recipe.sweep:
        return Choice(upstream, recipe.sweep, f"named by `sweep` ({recipe.origin_of('sweep')})")
    rule = "the recipe rule: the newest finished run with this recipe's sweep fields, else of its name"
    if not interactive:
        return Choice(upstream, None, rule)
    session = jupyter_session()
    if session:
        runs = _finished(c, upstream, f"tags.`{SESSION_TAG}` = '{_q(session)}'")
        if runs:
            return Choice(upstream, runs[0].data.tags.get("lab.id"),
                          "the newest finished one of this JupyterLab session")
    me = user()
    mine = [r for r in queries.latest_runs(c, upstream, recipe_name=recipe.name)
            if r.data.tags.get(USER_TAG) == me and r.data.tags.get("lab.mode") == "interactive"]
    if mine:
        return Choice(upstream, mine[0].data.tags.get("lab.id"),
                      f"the newest finished interactive one of user {me} for recipe `{recipe.name}` "
                      "(none in this JupyterLab session)")
    return Choice(upstream, None, rule + " (no run of this JupyterLab session or user)")


def _q(value: str) -> str:
    return value.replace("'", "''")


def _finished(c, notebook: str, flt: str) -> list:
    exp = tracking.get_experiment(c, notebook)
    if exp is None:
        return []
    return c.search_runs([exp.experiment_id], filter_string=f"attributes.status = 'FINISHED' and {flt}",
                         order_by=["attributes.start_time DESC"], max_results=1)
