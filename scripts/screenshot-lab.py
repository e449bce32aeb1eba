#!/usr/bin/env python3
"""Screenshots of a notebook run in JupyterLab, as a user makes one: `jupyter lab` on
127.0.0.1 with the project's config and kernel, headless Debian Chromium opens a notebook,
Run > Run All Cells, and a PNG is taken when the last cell has run (and one of the
run's page in the MLflow UI is left to tests/test_mlflow_ui.py with UI_SCREENSHOTS).

    .venv/bin/python scripts/screenshot-lab.py OUT_DIR [NOTEBOOK] [-p name=value ...]

The notebooks are copied into a scratch folder (the run never writes into the checkout),
the tracking store is MLFLOW_TRACKING_URI or a scratch SQLite file, and the server is
always stopped. Parameters given with -p replace the parameters cell's lines.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))
import browser  # noqa: E402  (tests/browser.py: Debian chromium under selenium, nothing downloaded)
import servers  # noqa: E402  (tests/servers.py: free port, wait until it answers, stop)

TOKEN = "labkit-shot"


def set_params(nb: Path, params: list[str]) -> None:
    import nbformat

    book = nbformat.read(nb, as_version=4)
    for cell in book.cells:
        if "parameters" in cell.metadata.get("tags", []):
            lines = cell.source.splitlines()
            for p in params:
                name, value = p.split("=", 1)
                hit = [i for i, line in enumerate(lines) if line.split("=")[0].strip() == name]
                if not hit:
                    raise SystemExit(f"screenshot-lab: {nb.name} declares no parameter {name!r}")
                lines[hit[0]] = f"{name} = {value}"
            cell.source = "\n".join(lines)
    nbformat.write(book, nb)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("out", type=Path)
    ap.add_argument("notebook", nargs="?", default="01_cost_fit.ipynb")
    ap.add_argument("-p", action="append", default=[], metavar="NAME=VALUE")
    ap.add_argument("--timeout", type=float, default=900)
    a = ap.parse_args()
    if browser.missing():
        raise SystemExit(f"screenshot-lab: {browser.missing()}")
    from selenium.webdriver.common.by import By

    a.out.mkdir(parents=True, exist_ok=True)
    base = Path(tempfile.mkdtemp(prefix="labkit-shot-"))
    root = base / "notebooks"
    shutil.copytree(ROOT / "notebooks", root, ignore=shutil.ignore_patterns(".ipynb_checkpoints"))
    if a.p:
        set_params(root / a.notebook, a.p)
        (root / a.notebook).with_suffix(".py").unlink(missing_ok=True)  # the jupytext pair would now be stale
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src"), "JUPYTER_RUNTIME_DIR": str(base / "runtime"),
           "MLFLOW_TRACKING_URI": os.environ.get("MLFLOW_TRACKING_URI", f"sqlite:///{base / 'mlflow.db'}"),
           "LABKIT_JOURNAL": str(base / "journal.jsonl")}
    port = servers.free_port()
    cmd = [sys.executable, "-m", "jupyterlab", "--no-browser", "--ServerApp.ip=127.0.0.1", f"--ServerApp.port={port}",
           "--ServerApp.port_retries=0", f"--IdentityProvider.token={TOKEN}", f"--ServerApp.root_dir={root}",
           f"--config={ROOT / 'jupyter-config' / 'jupyter_server_config.py'}"]
    if os.geteuid() == 0:
        cmd.append("--allow-root")
    log = open(base / "server.log", "w")
    proc = subprocess.Popen(cmd, env=env, stdout=log, stderr=subprocess.STDOUT, cwd=root)
    url = f"http://127.0.0.1:{port}"
    try:
        servers.wait_for_http(f"{url}/api/status?token={TOKEN}", proc, timeout=300, what="jupyter lab",
                              log=base / "server.log")
        with browser.chromium(page_load_timeout=120) as d:
            d.set_window_size(1500, 1100)
            d.get(f"{url}/lab/tree/{a.notebook}?token={TOKEN}")
            browser.wait_for_text(d, "parameters", timeout=120)
            time.sleep(5)  # the kernel starts and the toolbar settles
            menu = [m for m in d.find_elements(By.CSS_SELECTOR, ".lm-MenuBar-itemLabel") if m.text == "Run"][0]
            menu.click()
            item = [m for m in d.find_elements(By.CSS_SELECTOR, ".lm-Menu-itemLabel") if m.text == "Run All Cells"][0]
            item.click()
            t0 = time.monotonic()
            while time.monotonic() - t0 < a.timeout:  # "[*]" marks cells queued or running
                time.sleep(3)
                prompts = [p.text for p in d.find_elements(By.CSS_SELECTOR, ".jp-InputPrompt")]
                if prompts and not any("*" in p for p in prompts) and any(p.strip("[]: ") for p in prompts):
                    break
            shot = browser.screenshot(d, a.out / f"jupyterlab-{Path(a.notebook).stem}.png")  # the view after the run
        print(shot)
    except AssertionError as e:  # the server did not start: its log tail, not a traceback
        raise SystemExit(str(e)) from None
    finally:
        servers.stop(proc, timeout=60)
        log.close()
        shutil.rmtree(base, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
