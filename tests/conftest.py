"""Shared fixtures: the real embedded model on the real llama.cpp engine, loaded once."""

from __future__ import annotations

import pytest

from labkit.artifacts import zoo
from labkit.engines.llamacpp import LlamaCppEngine

N_CTX = 2048
# a user's environment must not change a test's outcome: these steer measurements or the store
_ENV_PREFIXES = ("AS_SPEC_", "LABKIT_", "MLFLOW_")


@pytest.fixture(scope="session", autouse=True)
def clean_environment():
    """Clear AS_SPEC_*, LABKIT_* and MLFLOW_* before any fixture or test runs (session
    scope, so module fixtures such as ``store`` set what they need after it)."""
    import os

    mp = pytest.MonkeyPatch()
    for var in list(os.environ):
        if var.startswith(_ENV_PREFIXES) and var not in _KEEP:
            mp.delenv(var)
    yield
    mp.undo()


# set by the test run itself (the model cache, so the zoo is built once per machine)
_KEEP = {"LABKIT_CACHE"}


@pytest.fixture(scope="session")
def embedded():
    return zoo.get(zoo.EMBEDDED)


@pytest.fixture(scope="session")
def engine(embedded):
    e = LlamaCppEngine(embedded.path, n_ctx=N_CTX, n_threads=2, artifact=embedded.describe())
    yield e
    e.close()


@pytest.fixture(scope="session")
def draft_engine():
    art = zoo.get("gemma-3-270m-q4_0")
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
