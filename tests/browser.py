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


# -- JupyterLab, driven through its own menus -------------------------------------------------
def _wait(driver, fn, *, timeout: float, message: str):
    from selenium.common.exceptions import NoSuchElementException, StaleElementReferenceException
    from selenium.webdriver.support.ui import WebDriverWait

    return WebDriverWait(driver, timeout, poll_frequency=0.25,
                         ignored_exceptions=(NoSuchElementException, StaleElementReferenceException)).until(
        fn, message=message)


def jupyterlab_menu(driver, menu: str, item: str, *, timeout: float = 60.0) -> None:
    """Click ``menu`` in JupyterLab's menu bar, then the entry whose label starts with ``item``
    (labels may end with "…")."""
    from selenium.webdriver.common.by import By

    top = _wait(driver, lambda d: [e for e in d.find_elements(By.CSS_SELECTOR, ".lm-MenuBar-itemLabel")
                                   if e.text == menu], timeout=timeout, message=f"no menu {menu!r}")
    top[0].click()
    entry = _wait(driver, lambda d: [e for e in d.find_elements(By.CSS_SELECTOR, ".lm-Menu-itemLabel")
                                     if e.is_displayed() and e.text.startswith(item)],
                  timeout=timeout, message=f"no entry {item!r} in the {menu} menu")
    entry[0].click()


def jupyterlab_accept_dialog(driver, *, timeout: float = 60.0) -> None:
    """Press the accept button of the dialog JupyterLab shows (e.g. "Shut Down")."""
    from selenium.webdriver.common.by import By

    button = _wait(driver, lambda d: [e for e in d.find_elements(By.CSS_SELECTOR, ".jp-Dialog-button.jp-mod-accept")
                                      if e.is_displayed()], timeout=timeout, message="no dialog to accept")
    button[0].click()


def _active_notebook(driver):
    from selenium.webdriver.common.by import By

    panels = [p for p in driver.find_elements(By.CSS_SELECTOR, ".jp-NotebookPanel") if p.is_displayed()]
    assert panels, "no notebook is shown"
    return panels[0]


def jupyterlab_replace_cell(driver, starts_with: str, lines: list[str], *, timeout: float = 60.0) -> None:
    """Type ``lines`` over the whole text of the first code cell whose text starts with
    ``starts_with``, as a user does: click into its editor, select all, type."""
    from selenium.webdriver.common.by import By
    from selenium.webdriver.common.keys import Keys

    def editor(d):
        for cell in _active_notebook(d).find_elements(By.CSS_SELECTOR, ".jp-CodeCell"):
            ed = cell.find_elements(By.CSS_SELECTOR, ".cm-content")
            if ed and ed[0].text.startswith(starts_with):
                return ed[0]
        return None

    ed = _wait(driver, editor, timeout=timeout, message=f"no code cell starting {starts_with!r}")
    ed.click()
    ed.send_keys(Keys.CONTROL, "a")
    ed.send_keys(Keys.DELETE)
    for i, line in enumerate(lines):  # line by line: the editor keeps no indentation for these
        ed.send_keys(line + (Keys.ENTER if i < len(lines) - 1 else ""))
    want = "\n".join(lines)
    _wait(driver, lambda d: editor_text(ed) == want, timeout=timeout,
          message=f"the cell did not read as typed: {editor_text(ed)!r}")
    ed.send_keys(Keys.ESCAPE)  # command mode: the menus act on the notebook


def editor_text(ed) -> str:
    from selenium.webdriver.common.by import By

    return "\n".join(line.text for line in ed.find_elements(By.CSS_SELECTOR, ".cm-line"))


def jupyterlab_first_output(driver, *, timeout: float = 60.0) -> str:
    """The first line of the first output of the notebook shown."""
    from selenium.webdriver.common.by import By

    out = _wait(driver, lambda d: [e for e in _active_notebook(d).find_elements(By.CSS_SELECTOR,
                                                                                 ".jp-OutputArea-output")
                                   if e.text.strip()], timeout=timeout, message="the notebook shows no output")
    return out[0].text.strip().splitlines()[0]


def jupyterlab_output_images(driver, *, at_least: int = 1, timeout: float = 60.0) -> int:
    """How many images the shown notebook's outputs draw (loaded, not broken). Waits until
    ``at_least`` have drawn (JupyterLab renders the cells below the fold after the first
    paint: counting at the first image read 1 of 02's 2 figures once), then returns the
    count; after ``timeout``, the most it saw (0 fails: nothing drew)."""
    from selenium.common.exceptions import TimeoutException
    from selenium.webdriver.common.by import By

    seen = [0]

    def count(d):
        imgs = _active_notebook(d).find_elements(By.CSS_SELECTOR, ".jp-OutputArea-output img")
        n = sum(1 for i in imgs if d.execute_script("return arguments[0].complete && arguments[0].naturalWidth > 100", i))
        seen[0] = max(seen[0], n)
        if imgs and n < at_least:  # bring the last output into view: the cells after it render too
            d.execute_script("arguments[0].scrollIntoView({block: 'end'})", imgs[-1])
        return n if n >= at_least else None

    try:
        _wait(driver, count, timeout=timeout, message=f"the notebook's outputs draw fewer than {at_least} images")
    except TimeoutException:
        if not seen[0]:
            raise
    first = _active_notebook(driver).find_elements(By.CSS_SELECTOR, ".jp-OutputArea-output img")[0]
    driver.execute_script("arguments[0].scrollIntoView({block: 'center'})", first)  # what a screenshot shows
    return seen[0]


def wait_for_link(driver, text: str, *, timeout: float = 30.0):
    """The first visible link (``<a>``) whose text is exactly ``text``."""
    from selenium.webdriver.common.by import By

    found = _wait(driver, lambda d: [e for e in d.find_elements(By.TAG_NAME, "a")
                                     if e.is_displayed() and e.text.strip() == text],
                  timeout=timeout, message=f"no link {text!r} on {driver.current_url}")
    return found[0]
