"""MLflow tracking and ``[LAB: …]`` provenance IDs.

ID scheme (short enough to cite in prose, unique per run, resolvable, related by recipe):

    LAB:01-3fa2c1-k7q2m          a notebook run: notebook number, recipe hash (6), run token (5)
    LAB:01-3fa2c1-k7q2m/c5       cell 5 of that run (executed code cells, counted from 1)
    LAB:01-3fa2c1-k7q2m/cost-fit a named figure or table of that run

Two runs of the same notebook and recipe share the ``01-3fa2c1`` prefix; the run token
is drawn from the MLflow run id and checked unique. Every run is tagged ``lab.id``,
so an ID resolves with one tag search, on a local SQLite store or an ``mlflow server``.
"""

from __future__ import annotations

import contextlib
import json
import os
from pathlib import Path

from labkit.errors import LabkitError
from labkit.paths import project_root
from labkit.provenance.ids import LabId, make_run_token, notebook_number
from labkit.provenance.store import auth_error, probe, redact, sqlite_client, store_kind


def tracking_uri() -> str:
    """``$MLFLOW_TRACKING_URI``, else a SQLite store in the project directory."""
    uri = os.environ.get("MLFLOW_TRACKING_URI")
    if uri:
        return uri
    return f"sqlite:///{project_root() / 'mlflow.db'}"


def artifact_root() -> str | None:
    """Where a new experiment's artifacts go; None lets the store decide.

    ``$LABKIT_ARTIFACT_ROOT`` when set (an S3 URI, a shared mount). Else a SQLite store
    keeps them beside its database file (``mlartifacts/``); an ``mlflow server`` keeps them
    itself (``--serve-artifacts``: ``mlflow-artifacts:/…``, readable by every client).
    A database spoken to directly has no such place: MLflow would pin the experiment to a
    path on the machine that created it, which no other machine can read, so it is refused.
    """
    explicit = os.environ.get("LABKIT_ARTIFACT_ROOT")
    if explicit:
        return explicit.rstrip("/")
    kind = store_kind()
    if kind == "sqlite":
        return (Path(tracking_uri()[len("sqlite:///"):]).parent / "mlartifacts").as_uri()
    if kind == "http":
        return None
    if kind == "database":
        raise LabkitError(
            f"MLFLOW_TRACKING_URI={redact(tracking_uri())} is a database: its experiments' artifacts "
            "would be pinned to a folder on this machine that no other machine can read",
            "point MLFLOW_TRACKING_URI at the team's `mlflow server` (http://host:5005, see `make team-server`), "
            "or set LABKIT_ARTIFACT_ROOT to a place every machine reads (s3://bucket/labkit, a shared mount)",
        )
    return (project_root() / "mlartifacts").as_uri()


def _local_location(loc: str | None) -> bool:
    return bool(loc) and (loc.startswith("file:") or loc.startswith("/") or ":" not in loc.split("/", 1)[0])


def experiment_prefix() -> str:
    """``$LABKIT_EXPERIMENT_PREFIX`` (default empty): prepended to every experiment name, so
    two projects on one tracking server keep their notebooks apart. Recorded on each run
    (tag ``lab.experiment_prefix``)."""
    return os.environ.get("LABKIT_EXPERIMENT_PREFIX", "")


def experiment_name(notebook: str) -> str:
    """The experiment a notebook's runs go to: the prefix, then the notebook's stem."""
    return experiment_prefix() + Path(notebook).stem


def get_experiment(c, notebook: str):
    """The experiment of ``notebook`` (prefix applied), or None. Every lookup by notebook
    name goes through here."""
    exp = c.get_experiment_by_name(experiment_name(notebook))
    if exp is not None and store_kind() in ("http", "database") and not os.environ.get("LABKIT_ARTIFACT_ROOT") \
            and _local_location(exp.artifact_location):
        raise LabkitError(
            f"experiment {exp.name!r} on {redact(tracking_uri())} keeps its artifacts at "
            f"{exp.artifact_location}, a folder on one machine that other clients cannot read",
            "start the server with --serve-artifacts (scripts/team-server.sh does), or use another "
            "LABKIT_EXPERIMENT_PREFIX; set LABKIT_ARTIFACT_ROOT if that folder is a shared mount",
        )
    return exp


def project_experiment_ids(c) -> list[str]:
    """Ids of this project's experiments (those named with the prefix)."""
    prefix = experiment_prefix()
    exps = c.search_experiments(filter_string=f"name LIKE '{prefix}%'" if prefix else None)
    return [e.experiment_id for e in exps]


def client(*, check: bool = True, uri: str | None = None):
    """An MlflowClient on ``uri`` (default: the tracking URI), checked to answer (a down server
    is a clear error).

    ``check=False`` skips the reachability probe (a notebook kernel under ``reproduce``,
    whose run already exists: if the server is away, its records go to the journal)."""
    from mlflow.tracking import MlflowClient

    uri = uri or tracking_uri()
    if store_kind(uri) == "sqlite":
        return sqlite_client(uri)
    c = MlflowClient(tracking_uri=uri)
    err = probe(c) if check else None
    if err is not None and (refused := auth_error(err, uri)) is not None:
        raise refused from err
    if err is not None:
        raise LabkitError(
            f"the MLflow tracking store at {redact(uri)} does not answer "
            f"({type(err).__name__}: {str(err)[:200]})",
            "start it (`make team-server`, or `mlflow server --host 127.0.0.1 --port 5000`), or unset "
            "MLFLOW_TRACKING_URI to use the local SQLite store; nothing was run, nothing recorded was touched",
        ) from err
    return c


# MLflow 3.x opens an experiment in its GenAI view (traces) unless the experiment says it
# holds model-development runs; the UI reads this tag (mlflow/server/js: ExperimentKind
# CUSTOM_MODEL_DEVELOPMENT = "custom_model_development", set via setExperimentTag).
EXPERIMENT_KIND_TAG = "mlflow.experimentKind"
EXPERIMENT_KIND = "custom_model_development"
PARENT_EXPERIMENT = "reproduce"  # one parent run per `labkit reproduce`; its notebooks are children


def experiment_id(c, notebook: str) -> str:
    """The experiment of ``notebook`` (under the configured prefix), created when missing
    (two writers may race to it)."""
    exp = get_experiment(c, notebook)
    if exp is not None:
        if exp.tags.get(EXPERIMENT_KIND_TAG) is None:  # a store from before the tag: mark it once
            c.set_experiment_tag(exp.experiment_id, EXPERIMENT_KIND_TAG, EXPERIMENT_KIND)
        return exp.experiment_id
    name = experiment_name(notebook)
    loc = artifact_root()  # None for a server or database store: the server decides
    try:
        return c.create_experiment(name, artifact_location=f"{loc}/{name}" if loc else None,
                                   tags={EXPERIMENT_KIND_TAG: EXPERIMENT_KIND})
    except Exception:
        exp = get_experiment(c, notebook)  # another writer created it first
        if exp is None:
            raise
        return exp.experiment_id


def mark_experiment_kinds(c) -> int:
    """Tag every experiment of a store made before the kind tag (so the UI opens on runs);
    returns how many were tagged."""
    n = 0
    for exp in c.search_experiments():
        if exp.tags.get(EXPERIMENT_KIND_TAG) is None:
            c.set_experiment_tag(exp.experiment_id, EXPERIMENT_KIND_TAG, EXPERIMENT_KIND)
            n += 1
    return n


def new_run(c, *, notebook: str, recipe, tags: dict | None = None, run_name: str | None = None,
            parent: str | None = None, source: str | None = None):
    """Create the MLflow run for one notebook execution and give it its LAB ID.

    The run is named ``<notebook> · <recipe> · LAB:<id>`` (``run_name`` replaces the
    first two parts) so runs are told apart in the runs table, and carries the tags the
    MLflow UI shows in its own fields: source notebook, git commit, parent run."""
    stem = Path(notebook).stem
    exp = experiment_id(c, stem)
    tags = {**(tags or {}), "lab.experiment_prefix": experiment_prefix()}
    run = c.create_run(exp, run_name=run_name, tags={k: str(v)[:5000] for k, v in tags.items()})
    rid = run.info.run_id
    prefix = f"{notebook_number(notebook)}-{recipe.hash[:6]}"
    token = make_run_token(rid)
    salt = 0
    while find_run(c, f"{prefix}-{token}", missing_ok=True) is not None:  # vanishingly rare
        salt += 1
        token = make_run_token(f"{salt:x}{rid}")
    lab = LabId(f"{prefix}-{token}")
    c.update_run(rid, name=f"{run_name or f'{stem} · {recipe.name}'} · {lab}")
    ui = {"lab.id": str(lab), "lab.run": lab.run,
          "mlflow.source.name": source or f"notebooks/{stem}.ipynb", "mlflow.source.type": "NOTEBOOK"}
    commit = (tags or {}).get("git.commit")
    if commit and commit != "unknown":
        ui["mlflow.source.git.commit"] = commit
    if parent:
        ui["mlflow.parentRunId"] = parent
    set_tags(c, rid, ui)
    return rid, lab


def set_tags(c, run_id: str, tags: dict) -> None:
    """Several tags in one request (each value cut to MLflow's 5000-character limit)."""
    from mlflow.entities import RunTag

    c.log_batch(run_id, tags=[RunTag(k, str(v)[:5000]) for k, v in tags.items()])


def param_text(value) -> str:
    """How a parameter value reads in the MLflow UI: strings plain, everything else JSON."""
    text = value if isinstance(value, str) else json.dumps(value, default=str)
    return text[:6000]  # MLflow's limit for a param value


def effective_params(params: dict, recipe) -> dict[str, str]:
    """The values a run used: each notebook parameter as the recipe resolved it (a ``None``
    meaning "the recipe's" becomes the recipe's value, ``recipe`` its name), then every
    other recipe field as ``recipe.<field>``. Keys are unique; values plain strings."""
    fields = recipe.to_dict()
    out = {}
    for k, v in params.items():
        out[k] = param_text(recipe.name if k == "recipe" else fields[k] if k in fields else v)
    for k, v in fields.items():
        if k not in params:
            out[f"recipe.{k}"] = param_text(v)
    return out


def log_params(c, run_id: str, params: dict[str, str]) -> None:
    """Log params in as few ``log_batch`` calls as MLflow allows (100 params per request)."""
    from mlflow.entities import Param

    items = [Param(k, v) for k, v in params.items()]
    for i in range(0, len(items), 100):
        c.log_batch(run_id, params=items[i:i + 100])


def new_parent_run(c, *, recipe, notebooks: list[str], output: str, tags: dict | None = None) -> str:
    """The parent run of one ``labkit reproduce``: each notebook's run is its child
    (``mlflow.parentRunId``). Children stay in their notebook's experiment (downstream
    notebooks find runs there), so the parent lives in the ``reproduce`` experiment."""
    exp = experiment_id(c, PARENT_EXPERIMENT)
    name = f"reproduce · {recipe.name} · {Path(output).name}"
    run = c.create_run(exp, run_name=name, tags={k: str(v)[:5000] for k, v in (tags or {}).items()})
    rid = run.info.run_id
    ui = {"mlflow.source.name": "labkit reproduce", "mlflow.source.type": "LOCAL", "lab.output": output,
          "lab.run": parent_key(rid),  # so `labkit sync` finds it when its close had to be journaled
          "lab.notebooks": ", ".join(notebooks), "recipe.effective_hash": recipe.hash}
    commit = (tags or {}).get("git.commit")
    if commit and commit != "unknown":
        ui["mlflow.source.git.commit"] = commit
    set_tags(c, rid, ui)
    log_params(c, rid, effective_params({}, recipe))
    return rid


def parent_key(run_id: str) -> str:
    return f"reproduce-{run_id}"


def parent_close(run_id: str, results: list[dict], *, status: str | None = None, tags: dict | None = None) -> dict:
    """The parent run's close as a journal record: FINISHED when every notebook finished,
    else FAILED (or ``status``); its note lists each child's LAB ID and status."""
    lines = [f"- `{r['notebook']}` [{r['id']}] {r['status']}" + (f": {r['error']}" if r.get("error") else "")
             for r in results]
    status = status or ("FINISHED" if results and all(r["status"] == "FINISHED" for r in results) else "FAILED")
    return {"run": parent_key(run_id), "type": "close", "status": status,
            "tags": {"mlflow.note.content": "labkit reproduce\n\n" + "\n".join(lines), **(tags or {})}}


def finish_parent(c, run_id: str, rec: dict) -> None:
    """Apply ``parent_close``'s record to the store."""
    set_tags(c, run_id, rec["tags"])
    c.set_terminated(run_id, rec["status"])


def find_run(c, run_key: str, *, missing_ok: bool = False):
    """The MLflow run whose ``lab.run`` tag is ``run_key`` (searched across experiments)."""
    exps = project_experiment_ids(c)
    runs = c.search_runs(exps, filter_string=f"tags.`lab.run` = '{run_key}'", max_results=2) if exps else []
    if not runs:
        if missing_ok:
            return None
        raise LabkitError(
            f"no run has the provenance ID LAB:{run_key} in {redact(tracking_uri())}"
            + (f" (experiments prefixed {experiment_prefix()!r})" if experiment_prefix() else ""),
            "check the ID, or point MLFLOW_TRACKING_URI at the store the chapter was written from",
        )
    return runs[0]


def log_json(c, run_id: str, obj, artifact_file: str) -> None:
    c.log_text(run_id, json.dumps(obj, indent=1, default=str, ensure_ascii=False), artifact_file)


@contextlib.contextmanager
def quiet_downloads():
    """MLflow's "Downloading artifacts" progress bars off for labkit's own reads: they would
    draw a stderr box (or a widget) into every notebook cell that reads a logged table.
    Scoped, so a user's own ``mlflow.artifacts.download_artifacts`` keeps its bar."""
    from mlflow.environment_variables import MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR as var

    before = os.environ.get(var.name)
    os.environ[var.name] = "false"
    try:
        yield
    finally:
        if before is None:
            os.environ.pop(var.name, None)
        else:
            os.environ[var.name] = before


def read_artifact(c, run_id: str, path: str) -> str:
    """The text of one logged artifact, or a clear error when it is missing or unreadable."""
    import tempfile

    try:
        with tempfile.TemporaryDirectory() as d, quiet_downloads():
            return Path(c.download_artifacts(run_id, path, d)).read_text()
    except Exception as e:
        raise LabkitError(
            f"run {run_id}: the artifact {path!r} is missing or unreadable ({type(e).__name__})",
            "the run's artifacts were deleted or moved: regenerate the run with `labkit reproduce` "
            "(or `labkit regen --rerun`)",
        ) from e


def load_json_artifact(c, run_id: str, path: str):
    return json.loads(read_artifact(c, run_id, path))


def _artifacts(c, run_id: str, folder: str) -> list[str]:
    try:
        return [a.path for a in c.list_artifacts(run_id, folder)]
    except Exception:
        return []


def _find_part(c, run, part: str) -> list[dict]:
    """Specs of the figures/tables an ID part names (a name, or every one a cell produced)."""
    rid = run.info.run_id
    specs = []
    for kind in ("figures", "tables"):
        for path in _artifacts(c, rid, kind):
            name = path.split("/")[-1]
            if part == name or part.startswith("c"):
                spec = load_json_artifact(c, rid, f"{path}/spec.json")
                if part == name or (part[1:].isdigit() and spec.get("cell") == int(part[1:])):
                    specs.append(spec)
    return specs
