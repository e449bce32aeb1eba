"""Headless Debian Chromium under selenium, with nothing downloaded.

Why the details matter: selenium >= 4.6 runs selenium-manager to find (and download) a
browser and driver unless both paths are given; this box has no route to those hosts, so
we pass Debian's /usr/bin/chromium and /usr/bin/chromedriver explicitly. --no-sandbox is
needed as root (CI), --disable-dev-shm-usage because containers have a tiny /dev/shm, and
the background-networking flags stop Chromium's own calls home on a closed network.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
from collections.abc import Iterator
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from selenium.webdriver import Chrome

CHROMIUM = os.environ.get("LABKIT_CHROMIUM", "/usr/bin/chromium")
CHROMEDRIVER = os.environ.get("LABKIT_CHROMEDRIVER", "/usr/bin/chromedriver")

_FLAGS = (
    "--headless=new",
    "--no-sandbox",
    "--disable-dev-shm-usage",
    "--disable-gpu",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--window-size=1400,1000",
)


def missing() -> str | None:
    """A message naming what to install, or None when browser tests can run."""
    try:
        import selenium  # noqa: F401
    except ImportError:
        return "selenium is not installed: pip install selenium"
    for path in (CHROMIUM, CHROMEDRIVER):
        if not os.access(path, os.X_OK):
            return f"{path} not found: run scripts/system-deps.sh (Debian chromium, chromium-driver)"
    return None


@contextlib.contextmanager
def chromium(*, page_load_timeout: float = 30.0) -> Iterator[Chrome]:
    """Yield a headless Chrome webdriver; always quit it and remove its profile."""
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    profile = tempfile.mkdtemp(prefix="labkit-chromium-")
    opts = webdriver.ChromeOptions()
    opts.binary_location = CHROMIUM
    for flag in _FLAGS:
        opts.add_argument(flag)
    opts.add_argument(f"--user-data-dir={profile}")
    driver = webdriver.Chrome(service=Service(executable_path=CHROMEDRIVER), options=opts)
    try:
        driver.set_page_load_timeout(page_load_timeout)
        yield driver
    finally:
        driver.quit()
        shutil.rmtree(profile, ignore_errors=True)


def screenshot(driver, path: str | os.PathLike) -> str:
    """Save a PNG of the current viewport to path; return the path."""
    path = os.fspath(path)
    if not driver.save_screenshot(path):
        raise RuntimeError(f"screenshot failed: {path}")
    return path


def wait_for_text(driver, text: str, *, timeout: float = 30.0) -> None:
    """Wait until text appears anywhere in the rendered page (React apps render late)."""
    from selenium.common.exceptions import StaleElementReferenceException
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait

    # React replaces <body>'s children while it renders: a stale element is a retry.
    WebDriverWait(driver, timeout, poll_frequency=0.25,
                  ignored_exceptions=(StaleElementReferenceException,)).until(
        lambda d: text in d.find_element(By.TAG_NAME, "body").text,
        message=f"text {text!r} not visible within {timeout} s on {driver.current_url}",
    )


def wait_for_row(driver, key: str, *, timeout: float = 30.0) -> str:
    """Text of the table row whose cell reads exactly key, e.g. "draft_k\n3" (MLflow run page)."""
    from selenium.common.exceptions import NoSuchElementException, StaleElementReferenceException
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait

    xpath = (f"//*[@role='row' or self::tr][.//*[normalize-space(text())='{key}']]")
    return WebDriverWait(driver, timeout, poll_frequency=0.25,
                         ignored_exceptions=(NoSuchElementException, StaleElementReferenceException)).until(
        lambda d: d.find_element(By.XPATH, xpath).text,
        message=f"no row for {key!r} within {timeout} s on {driver.current_url}")
