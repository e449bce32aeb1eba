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

import json
import os
from pathlib import Path

from labkit.errors import LabkitError
from labkit.paths import project_root
from labkit.provenance.ids import LabId, make_run_token, notebook_number


def tracking_uri() -> str:
    """``$MLFLOW_TRACKING_URI``, else a SQLite store in the project directory."""
    uri = os.environ.get("MLFLOW_TRACKING_URI")
    if uri:
        return uri
    return f"sqlite:///{project_root() / 'mlflow.db'}"


def artifact_root() -> str:
    """Artifacts of a local store sit beside its database file (``mlartifacts/``)."""
    uri = tracking_uri()
    if uri.startswith("sqlite:///"):
        return (Path(uri[len("sqlite:///"):]).parent / "mlartifacts").as_uri()
    return (project_root() / "mlartifacts").as_uri()


def client():
    """An MlflowClient on the tracking URI, checked to answer (a down server is a clear error)."""
    os.environ.setdefault("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "1")
    os.environ.setdefault("MLFLOW_HTTP_REQUEST_TIMEOUT", "10")
    from mlflow.tracking import MlflowClient

    uri = tracking_uri()
    c = MlflowClient(tracking_uri=uri)
    try:
        c.search_experiments(max_results=1)
    except Exception as e:  # mlflow raises several types for an unreachable server
        raise LabkitError(
            f"the MLflow tracking store at {uri} does not answer ({type(e).__name__}: {str(e)[:200]})",
            "start it (e.g. `mlflow server --host 127.0.0.1 --port 5000`), or unset MLFLOW_TRACKING_URI "
            "to use the local SQLite store; nothing was run, nothing recorded was touched",
        ) from e
    return c


# MLflow 3.x opens an experiment in its GenAI view (traces) unless the experiment says it
# holds model-development runs; the UI reads this tag (mlflow/server/js: ExperimentKind
# CUSTOM_MODEL_DEVELOPMENT = "custom_model_development", set via setExperimentTag).
EXPERIMENT_KIND_TAG = "mlflow.experimentKind"
EXPERIMENT_KIND = "custom_model_development"
PARENT_EXPERIMENT = "reproduce"  # one parent run per `labkit reproduce`; its notebooks are children


def experiment_id(c, name: str) -> str:
    exp = c.get_experiment_by_name(name)
    if exp is not None:
        if exp.tags.get(EXPERIMENT_KIND_TAG) is None:  # a store from before the tag: mark it once
            c.set_experiment_tag(exp.experiment_id, EXPERIMENT_KIND_TAG, EXPERIMENT_KIND)
        return exp.experiment_id
    # A remote server decides where artifacts go; a local store keeps them in the project.
    loc = None if tracking_uri().startswith("http") else f"{artifact_root()}/{name}"
    return c.create_experiment(name, artifact_location=loc, tags={EXPERIMENT_KIND_TAG: EXPERIMENT_KIND})










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
    run = c.create_run(exp, run_name=run_name, tags={k: str(v)[:5000] for k, v in (tags or {}).items()})
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
          "lab.notebooks": ", ".join(notebooks), "recipe.effective_hash": recipe.hash}
    commit = (tags or {}).get("git.commit")
    if commit and commit != "unknown":
        ui["mlflow.source.git.commit"] = commit
    set_tags(c, rid, ui)
    log_params(c, rid, effective_params({}, recipe))
    return rid


def finish_parent(c, run_id: str, results: list[dict]) -> None:
    """Close the parent run: FINISHED when every notebook finished, else FAILED; its note
    lists each child's LAB ID and status."""
    lines = [f"- `{r['notebook']}` [{r['id']}] {r['status']}" + (f": {r['error']}" if r.get("error") else "")
             for r in results]
    status = "FINISHED" if results and all(r["status"] == "FINISHED" for r in results) else "FAILED"
    set_tags(c, run_id, {"mlflow.note.content": "labkit reproduce\n\n" + "\n".join(lines)})
    c.set_terminated(run_id, status)


def find_run(c, run_key: str, *, missing_ok: bool = False):
    """The MLflow run whose ``lab.run`` tag is ``run_key`` (searched across experiments)."""
    exps = [e.experiment_id for e in c.search_experiments()]
    runs = c.search_runs(exps, filter_string=f"tags.`lab.run` = '{run_key}'", max_results=2) if exps else []
    if not runs:
        if missing_ok:
            return None
        raise LabkitError(
            f"no run has the provenance ID LAB:{run_key} in {tracking_uri()}",
            "check the ID, or point MLFLOW_TRACKING_URI at the store the chapter was written from",
        )
    return runs[0]


def log_json(c, run_id: str, obj, artifact_file: str) -> None:
    c.log_text(run_id, json.dumps(obj, indent=1, default=str, ensure_ascii=False), artifact_file)


def read_artifact(c, run_id: str, path: str) -> str:
    """The text of one logged artifact, or a clear error when it is missing or unreadable."""
    import tempfile

    try:
        with tempfile.TemporaryDirectory() as d:
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
