"""Shared fixtures: the real embedded model on the real llama.cpp engine, loaded once."""

from __future__ import annotations

import pytest

from labkit import models
from labkit.engines.llamacpp import LlamaCppEngine

N_CTX = 2048


@pytest.fixture(scope="session")
def embedded():
    return models.get(models.EMBEDDED)


@pytest.fixture(scope="session")
def engine(embedded):
    e = LlamaCppEngine(embedded.path, n_ctx=N_CTX, n_threads=2, artifact=embedded.describe())
    yield e
    e.close()


@pytest.fixture(scope="session")
def draft_engine():
    art = models.get("gemma-3-270m-q4_0")
    e = LlamaCppEngine(art.path, n_ctx=N_CTX, n_threads=2, artifact=art.describe())
    yield e
    e.close()


@pytest.fixture
def tmp_cache(tmp_path, monkeypatch):
    """An empty model cache, for tests that damage or rebuild artifacts."""
    monkeypatch.setenv("LABKIT_CACHE", str(tmp_path / "cache"))
    return tmp_path / "cache"


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    """A fresh SQLite MLflow store (and artifact folder) for one test module."""
    d = tmp_path_factory.mktemp("mlflow")
    mp = pytest.MonkeyPatch()
    mp.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{d / 'mlflow.db'}")
    yield d
    mp.undo()
