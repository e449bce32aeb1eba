"""Run tags: the parts of a provenance record (git, host, recipe, gate, engine build)
that belong in MLflow's searchable tags; the full record is an artifact.
"""

from __future__ import annotations

import json


def flat_tags(prov: dict) -> dict:
    """The provenance fields that belong in run tags (the full record is an artifact)."""
    host = prov.get("host", {})
    git = prov.get("git", {})
    t = {
        "git.commit": git.get("commit"),
        "git.dirty": git.get("dirty"),
        "host.cpu": host.get("cpu"),
        "host.cpu_id": host.get("cpu_id"),
        "host.cores": host.get("cores"),
        "host.memory_gb": round((host.get("memory_bytes") or 0) / 2**30, 1),
        "host.os": host.get("os"),
        "host.name": host.get("hostname"),
        "host.label": host.get("label"),
        "host.label_source": host.get("label_source"),
        "host.accelerator": host.get("accelerator"),
        "host.power": host.get("power"),
        "packages": json.dumps(prov.get("packages", {}), sort_keys=True),
    }
    if "recipe" in prov:
        rec = prov["recipe"]
        t.update({"recipe": rec["name"], "recipe.hash": rec["hash"]})
        if "gate" in rec:
            t.update({"gate.threshold": rec["gate"]["threshold"], "gate.source": rec["gate"]["source"]})
        t.update({f"recipe.origin.{k}": v for k, v in rec.get("origins", {}).items()})
    return {k: v for k, v in t.items() if v is not None}


def machine_of(tags: dict) -> tuple[str | None, str | None, str | None]:
    """(host label, engine build, CPU) of a run from its tags: what "previous" and "latest"
    are per. Runs logged before host labels existed fall back to their hostname; the CPU
    (``host.cpu_id``) tells apart boxes that share a label and a model name (clouds call
    Zen 2 and Zen 3 alike "AMD EPYC", on hosts all named "vm"), None for runs before it."""
    return tags.get("host.label") or tags.get("host.name"), tags.get("engine.build"), tags.get("host.cpu_id")


def engine_build(desc: dict) -> str | None:
    """One short name for an engine build: engine, version, commit, and a hash of the build
    flags, BLAS and patches (two builds that differ only in flags or in the patches carried on
    the pinned llama.cpp are different builds; a build without patches keeps its old name)."""
    import hashlib

    b = desc.get("build", {})
    version = b.get("llama_cpp_python") or b.get("mlx_lm")
    if not desc.get("engine") and not version:
        return None
    blas = b.get("blas")
    patches = [p.get("sha256") for p in b.get("patches") or []]
    detail = json.dumps([b.get("cmake_args"), blas.get("blas") if isinstance(blas, dict) else blas]
                        + ([patches] if patches else []), default=str)
    parts = [desc.get("engine"), version, (b.get("llama_cpp_commit") or "")[:7], hashlib.sha256(detail.encode()).hexdigest()[:6]]
    return "-".join(str(p) for p in parts if p)


def patch_text(patches: list | None) -> str | None:
    """``'tinyblas-q0-small-n.patch (ggml-org/llama.cpp#10343 #10714 #8908)'``, None without patches."""
    if not patches:
        return None
    return "; ".join(f"{p.get('name')} ({' '.join(p.get('upstream') or []) or 'no upstream reference'})"
                     for p in patches)


def engine_tags(desc: dict) -> dict:
    b = desc.get("build", {})
    m = desc.get("model", {})
    return {
        k: v
        for k, v in {
            "engine": desc.get("engine"),
            "engine.version": b.get("llama_cpp_python") or b.get("mlx_lm"),
            "engine.build": engine_build(desc),
            "engine.commit": b.get("llama_cpp_commit"),
            "engine.flags": b.get("cmake_args"),
            "engine.patches": patch_text(b.get("patches")),
            "engine.blas": (b.get("blas") or {}).get("blas") if isinstance(b.get("blas"), dict) else b.get("blas"),
            "engine.label": desc.get("label"),
            "engine.system_info": b.get("system_info"),
            "engine.threads": desc.get("threads"),
            "engine.n_gpu_layers": desc.get("n_gpu_layers"),
            "model.name": m.get("name"),
            "model.sha256": m.get("sha256"),
            "model.sha256_verified": m.get("sha256_verified"),
            "model.synthetic": m.get("synthetic"),
            "residency": json.dumps(desc.get("residency")) if desc.get("residency") else None,
        }.items()
        if v is not None
    }
