"""environment.yml (conda users) and pyproject's dependencies stay in step; CI runs the README's command."""

from __future__ import annotations

import importlib.util
import re
import sys
from pathlib import Path

import pytest
import tomllib
import yaml

from labkit.paths import project_root

ROOT = project_root()


def _pins(reqs) -> dict[str, str]:
    """name -> version spec, ignoring extras and environment markers."""
    out = {}
    for r in reqs:
        r = r.split(";")[0].strip()
        if r.startswith("-"):
            continue
        name, spec = re.match(r"([A-Za-z0-9_.\-]+)(?:\[[^\]]*\])?\s*(.*)", r).groups()
        out[name.lower().replace("_", "-")] = spec.replace(" ", "")
    return out


def test_environment_yml_matches_pyproject():
    py = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    env = yaml.safe_load((ROOT / "environment.yml").read_text())
    pip_block = next(d["pip"] for d in env["dependencies"] if isinstance(d, dict))
    extras = py["optional-dependencies"]
    want = _pins(py["dependencies"] + extras["dev"] + extras["mlx"] + extras["postgres"])
    have = _pins(pip_block)
    assert want == have
    assert "-e ." in pip_block  # labkit itself


def test_ci_runs_the_readme_test_command():
    readme = (ROOT / "README.md").read_text()
    ci = (ROOT / ".ci" / "run").read_text()
    assert "make test" in readme and "make reproduce" in readme
    assert [ln for ln in ci.splitlines() if ln and not ln.startswith("#")] == ["exec make test"]


def test_setup_venv_is_byte_compiled():
    """scripts/setup.sh byte-compiles what it installs (uv --compile-bytecode, compileall on
    src/labkit): where PYTHONDONTWRITEBYTECODE=1 is set nothing is cached at import, so a
    venv without .pyc files recompiles mlflow, pandas and matplotlib in every process."""
    if (ROOT / ".venv").resolve() != Path(sys.prefix).resolve():
        pytest.skip(f"not running in the venv scripts/setup.sh makes ({sys.prefix})")
    import matplotlib
    import mlflow
    import pandas

    import labkit.lab.session

    missing = [m.__name__ for m in (mlflow, pandas, matplotlib, labkit.lab.session)
               if not Path(importlib.util.cache_from_source(m.__file__)).is_file()]
    assert not missing, f"no byte-compiled cache for {missing}: setup.sh must compile at install time"
