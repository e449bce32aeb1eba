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
import re
import string
from dataclasses import dataclass
from pathlib import Path

from .errors import LabkitError
from .paths import project_root

ID_RE = re.compile(r"^\[?\s*(?:LAB:\s*)?(?P<run>\d{2}-[0-9a-f]{6}-[a-z0-9]{5})(?:/(?P<part>[A-Za-z0-9_.\-]+))?\s*\]?$")
_ALPHABET = string.ascii_lowercase + string.digits


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


def experiment_id(c, name: str) -> str:
    exp = c.get_experiment_by_name(name)
    if exp is not None:
        return exp.experiment_id
    # A remote server decides where artifacts go; a local store keeps them in the project.
    loc = None if tracking_uri().startswith("http") else f"{artifact_root()}/{name}"
    return c.create_experiment(name, artifact_location=loc)


def notebook_number(notebook: str) -> str:
    m = re.match(r"(\d{2})", Path(notebook).name)
    return m.group(1) if m else "00"


def make_run_token(run_id: str) -> str:
    n = int(run_id[:16], 16) if re.fullmatch(r"[0-9a-f]+", run_id[:16]) else hash(run_id)
    return "".join(_ALPHABET[(n >> (6 * i)) % len(_ALPHABET)] for i in range(5))


@dataclass(frozen=True)
class LabId:
    run: str  # "01-3fa2c1-k7q2m"
    part: str | None = None  # "c5" or a figure/table name

    def __str__(self) -> str:
        return f"LAB:{self.run}" + (f"/{self.part}" if self.part else "")

    @property
    def cite(self) -> str:
        return f"[{self}]"

    def child(self, part: str) -> LabId:
        return LabId(self.run, part)


def parse_id(text: str) -> LabId:
    m = ID_RE.match(text.strip())
    if not m:
        raise LabkitError(
            f"{text!r} is not a labkit provenance ID",
            "IDs look like LAB:01-3fa2c1-k7q2m, LAB:01-3fa2c1-k7q2m/c5 or LAB:01-3fa2c1-k7q2m/cost-fit",
        )
    return LabId(m.group("run"), m.group("part"))


def new_run(c, *, notebook: str, recipe, tags: dict | None = None, run_name: str | None = None):
    """Create the MLflow run for one notebook execution and give it its LAB ID."""
    exp = experiment_id(c, Path(notebook).stem)
    run = c.create_run(exp, run_name=run_name, tags={k: str(v)[:5000] for k, v in (tags or {}).items()})
    rid = run.info.run_id
    prefix = f"{notebook_number(notebook)}-{recipe.hash[:6]}"
    token = make_run_token(rid)
    salt = 0
    while find_run(c, f"{prefix}-{token}", missing_ok=True) is not None:  # vanishingly rare
        salt += 1
        token = make_run_token(f"{salt:x}{rid}")
    lab = LabId(f"{prefix}-{token}")
    c.set_tag(rid, "lab.id", str(lab))
    c.set_tag(rid, "lab.run", lab.run)
    return rid, lab


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


def flat_tags(prov: dict) -> dict:
    """The provenance fields that belong in run tags (the full record is an artifact)."""
    host = prov.get("host", {})
    git = prov.get("git", {})
    t = {
        "git.commit": git.get("commit"),
        "git.dirty": git.get("dirty"),
        "host.cpu": host.get("cpu"),
        "host.cores": host.get("cores"),
        "host.memory_gb": round((host.get("memory_bytes") or 0) / 2**30, 1),
        "host.os": host.get("os"),
        "host.name": host.get("hostname"),
        "packages": json.dumps(prov.get("packages", {}), sort_keys=True),
    }
    if "recipe" in prov:
        t.update({"recipe": prov["recipe"]["name"], "recipe.hash": prov["recipe"]["hash"]})
    return {k: v for k, v in t.items() if v is not None}


def engine_tags(desc: dict) -> dict:
    b = desc.get("build", {})
    m = desc.get("model", {})
    return {
        k: v
        for k, v in {
            "engine": desc.get("engine"),
            "engine.version": b.get("llama_cpp_python") or b.get("mlx_lm"),
            "engine.commit": b.get("llama_cpp_commit"),
            "engine.flags": b.get("cmake_args"),
            "engine.blas": (b.get("blas") or {}).get("blas") if isinstance(b.get("blas"), dict) else b.get("blas"),
            "engine.label": desc.get("label"),
            "engine.system_info": b.get("system_info"),
            "engine.threads": desc.get("threads"),
            "engine.n_gpu_layers": desc.get("n_gpu_layers"),
            "model.name": m.get("name"),
            "model.sha256": m.get("sha256"),
            "model.synthetic": m.get("synthetic"),
            "residency": json.dumps(desc.get("residency")) if desc.get("residency") else None,
        }.items()
        if v is not None
    }
