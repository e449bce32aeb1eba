"""Integrity of what is recorded: a pinned checksum holds for the bytes that run.

The attack the cache must survive: the same size, the same mtime, one byte different
(a bit flip on disk, a botched copy with ``cp -p``, a tool that restores mtimes). Size and
mtime alone cannot tell; the stat key's inode and ctime can.
"""

from __future__ import annotations

import os
import shutil

import pytest

from labkit.artifacts import zoo
from labkit.errors import LabkitError
from labkit.provenance import runtags
from labkit.suites.workloads import load_prompt_file


def _flip_one_byte_keep_size_and_mtime(path):
    st = path.stat()
    with open(path, "r+b") as f:
        f.seek(st.st_size // 2)
        b = f.read(1)
        f.seek(st.st_size // 2)
        f.write(bytes([b[0] ^ 0xFF]))
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))
    after = path.stat()
    assert (after.st_size, after.st_mtime_ns) == (st.st_size, st.st_mtime_ns)


@pytest.fixture
def user_copy(embedded, tmp_path, monkeypatch):
    """The embedded model copied to a user path (mtime kept), with its own hash cache."""
    monkeypatch.setenv("LABKIT_CACHE", str(tmp_path / "cache"))
    p = tmp_path / "models" / "mine.gguf"
    p.parent.mkdir()
    shutil.copy2(embedded.path, p)
    return p


def test_pinned_checksum_refuses_a_same_size_same_mtime_corrupted_user_model(user_copy, embedded):
    art = zoo.get(str(user_copy), expected_sha256=embedded.sha256)  # hashed once, remembered
    assert art.sha256 == embedded.sha256 and art.sha256_verified
    _flip_one_byte_keep_size_and_mtime(user_copy)
    with pytest.raises(LabkitError, match="checksum mismatch") as e:
        zoo.get(str(user_copy), expected_sha256=embedded.sha256)
    assert e.value.fix and embedded.sha256 in e.value.problem


def test_unpinned_hash_is_the_bytes_hash_and_not_marked_verified(user_copy, embedded):
    art = zoo.get(str(user_copy))
    assert art.sha256 == embedded.sha256 and not art.sha256_verified
    _flip_one_byte_keep_size_and_mtime(user_copy)
    art2 = zoo.get(str(user_copy))
    assert art2.sha256 == zoo.sha256_file(user_copy) != embedded.sha256 and not art2.sha256_verified
    # and the flag reaches the run's tags
    tags = runtags.engine_tags({"model": art2.describe()})
    assert tags["model.sha256_verified"] is False and tags["model.sha256"] == art2.sha256


def test_corrupted_zoo_file_with_same_size_and_mtime_is_rebuilt_not_trusted(tmp_cache):
    art = zoo.get(zoo.EMBEDDED)  # assembled into the empty cache, sidecar written
    assert art.sha256_verified
    _flip_one_byte_keep_size_and_mtime(art.path)
    again = zoo.get(zoo.EMBEDDED)
    assert zoo.sha256_file(again.path) == again.sha256 == art.sha256  # rebuilt from the package
    assert again.sha256_verified


def test_stat_key_unchanged_reuses_the_hash_without_reading(user_copy, embedded, monkeypatch):
    zoo.get(str(user_copy))
    calls = []
    monkeypatch.setattr(zoo, "sha256_file", lambda p, *a, **k: calls.append(p) or "0" * 64)
    assert zoo.get(str(user_copy)).sha256 == embedded.sha256 and calls == []
    os.utime(user_copy)  # a touch: same bytes, but the key moved, so they are read again
    assert zoo.get(str(user_copy)).sha256 == "0" * 64 and calls == [user_copy]


@pytest.mark.parametrize("name, content, match", [
    ("missing.txt", None, "not found"),
    ("empty.txt", "  \n", "empty"),
    ("bad.jsonl", "{not json\n", "not valid JSON"),
    ("noprompt.jsonl", '{"id": "a", "prompt": " ", "source": "me"}\n', "prompt is empty"),
    ("nothing.jsonl", "\n", "holds no prompts"),
    ("prompt.md", "hello", "unsupported"),
])
def test_prompt_file_errors_say_how_to_fix_them(tmp_path, name, content, match):
    p = tmp_path / name
    if content is not None:
        p.write_text(content)
    with pytest.raises(LabkitError, match=match) as e:
        load_prompt_file(p)
    assert e.value.fix, f"no fix line for {name}"
