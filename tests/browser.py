"""Real JupyterLab servers started as a user starts them (`make lab`, `make instructor`),
and Debian's Chromium driven by Playwright (no browser download), for the browser tests.

Screenshots go to .test-screenshots/ in the repository (ignored by git), where a person
can look at what a failing test saw.
"""
from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import time
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from autograder.authoring import ROOT

SCREENSHOTS = ROOT / ".test-screenshots"
CHROMIUM = "/usr/bin/chromium"
TOKEN = "course-test-token"
# Root needs --no-sandbox; this machine has no network, so nothing may phone home.
CHROMIUM_ARGS = ["--no-sandbox", "--disable-gpu", "--disable-background-networking", "--disable-component-update",
                 "--no-first-run", "--disable-sync", "--disable-quic"]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def get_json(url: str):
    with urllib.request.urlopen(url, timeout=5) as response:
        return json.loads(response.read())


@contextlib.contextmanager
def lab(target: str, tmp: Path, **make_vars: str) -> Iterator[str]:
    """`make TARGET` serving JupyterLab on a free port; yields its base URL."""
    port = free_port()
    args = f"--no-browser --port={port} --ServerApp.ip=127.0.0.1 --IdentityProvider.token={TOKEN}"
    env = {**os.environ, "JUPYTER_CONFIG_DIR": str(tmp / "config"), "JUPYTER_RUNTIME_DIR": str(tmp / "run"),
           "JUPYTER_DATA_DIR": str(tmp / "data"), "JUPYTERLAB_WORKSPACES_DIR": str(tmp / "workspaces")}
    # A person's own settings, as anyone may have them: every cell rendered (a screenshot
    # of any cell shows it), and no question about news popping up over the notebook.
    settings = tmp / "settings"
    for plugin, values in (("notebook-extension/tracker", {"windowingMode": "none"}),
                           ("apputils-extension/notification", {"fetchNews": "false"})):
        path = settings / "@jupyterlab" / f"{plugin}.jupyterlab-settings"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(values))
    env["JUPYTERLAB_SETTINGS_DIR"] = str(settings)
    variables = [f"{k}={v}" for k, v in make_vars.items()]
    log = open(tmp / f"{target}.log", "w")
    server = subprocess.Popen(["make", "--no-print-directory", target, f"LAB_ARGS={args}", *variables], cwd=ROOT,
                              env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    base = f"http://127.0.0.1:{port}"
    try:
        for _ in range(240):
            try:
                get_json(f"{base}/api/status?token={TOKEN}")
                break
            except OSError:
                if server.poll() is not None:
                    pytest.fail(f"make {target} stopped: {(tmp / f'{target}.log').read_text()[-3000:]}")
                time.sleep(0.5)
        else:
            pytest.fail(f"make {target}: JupyterLab did not start within 120 s")
        yield base
    finally:
        os.killpg(server.pid, signal.SIGTERM)
        try:
            server.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(server.pid, signal.SIGKILL)
        log.close()


@contextlib.contextmanager
def chromium() -> Iterator:
    """Debian's Chromium, driven by Playwright. Each `person(it)` is someone at a browser of
    their own (a fresh context: no cookies or storage shared with anyone else's)."""
    if not Path(CHROMIUM).exists():
        pytest.fail(f"{CHROMIUM} is missing: run `make test-tools` (Debian's chromium)")
    from playwright.sync_api import sync_playwright

    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=CHROMIUM, headless=True, args=CHROMIUM_ARGS)
        try:
            yield browser
        finally:
            browser.close()


def person(chromium):
    """A new page, in a context of its own: a person with their own cookies (closing the page
    closes it)."""
    return chromium.new_page(viewport={"width": 1400, "height": 900})


def screenshot(page, name: str) -> Path:
    SCREENSHOTS.mkdir(exist_ok=True)
    path = SCREENSHOTS / f"{name}.png"
    page.screenshot(path=str(path))
    return path


def element_screenshot(locator, name: str) -> Path:
    """A screenshot of one element (a cell with its output), scrolled into view."""
    SCREENSHOTS.mkdir(exist_ok=True)
    path = SCREENSHOTS / f"{name}.png"
    locator.scroll_into_view_if_needed()
    locator.screenshot(path=str(path))
    return path


def _select_kernel(page) -> bool:
    """Click Select if JupyterLab asks which kernel to use (it does when other notebooks'
    kernels are running, or a kernel was slow to start), as a person would."""
    select = page.locator(".jp-Dialog:has-text('Select Kernel') button.jp-mod-accept")
    if not select.count():
        return False
    select.first.click()
    return True


def open_notebook(page, base: str, path: str) -> None:
    page.goto(f"{base}/lab/tree/{path}?reset&token={TOKEN}")  # reset: only this notebook open
    wait_for_kernel(page)


IDLE = ".jp-Notebook-ExecutionIndicator[data-status='idle']"
# The open notebook's kernel started (the toolbar names it) and idle, or JupyterLab asks which to use.
KERNEL_UP_OR_ASKED = (
    "() => !!document.querySelector('.jp-Dialog') || ("
    "[...document.querySelectorAll('.jp-KernelName')].some(e => e.textContent.includes('Python')) && "
    f"!!document.querySelector({json.dumps(IDLE)}))"
)


def wait_for_kernel(page, timeout: float = 60_000) -> None:
    """Until the notebook shown has its cells and its kernel is up and idle (Select, if
    JupyterLab asks which kernel to use)."""
    page.wait_for_selector(".jp-Notebook .jp-Cell", timeout=timeout)
    page.wait_for_function(KERNEL_UP_OR_ASKED, timeout=timeout)
    if _select_kernel(page):
        page.wait_for_function(KERNEL_UP_OR_ASKED, timeout=timeout)


def run_all(page) -> None:
    """Run → Run All Cells, as a person clicks it."""
    page.click("li.lm-MenuBar-item:has-text('Run')")
    page.click("li.lm-Menu-item:has-text('Run All Cells')")


HAS_OUTPUT = (
    "([code, text]) => [...document.querySelectorAll('.jp-Cell')].some(c => "
    "(c.querySelector('.jp-InputArea')?.textContent || '').includes(code) && "
    "(c.querySelector('.jp-OutputArea')?.textContent || '').includes(text))"
)


AGAIN = 15.0  # seconds the kernel may sit idle after Run All before it is clicked again


def wait_until(page, ready: Callable[[], bool], what: str, timeout: float = 120_000, again: bool = True) -> None:
    """Until `ready()`, after Run All. Cells sent while JupyterLab asked which kernel to use,
    or while a busy machine was still starting it, never ran: a person would click Select
    and Run All again, and so does this (`again=False`: not after running one cell)."""
    deadline = time.monotonic() + timeout / 1000
    clicked = time.monotonic()
    while not ready():
        if time.monotonic() > deadline:
            raise TimeoutError(f"no {what} after {timeout / 1000:g} s")
        selected = _select_kernel(page)
        if selected or (again and time.monotonic() - clicked > AGAIN and page.locator(IDLE).count()):
            page.wait_for_selector(IDLE, timeout=60_000)
            run_all(page)
            clicked = time.monotonic()
        page.wait_for_timeout(500)


def wait_for_output(page, code: str, text: str, timeout: float = 120_000, again: bool = True) -> None:
    """Until the cell whose code contains `code` has an output containing `text`."""
    wait_until(page, lambda: page.evaluate(HAS_OUTPUT, [code, text]),
               f"output containing {text!r} under the cell {code!r}", timeout, again)


def cell(page, code: str):
    """The cell whose code contains `code`."""
    return page.locator(f".jp-Cell:has(.jp-InputArea:has-text({json.dumps(code)}))").first


def type_into(page, code: str, source: str) -> None:
    """Replace the code of the cell whose code contains `code`, as a person types it."""
    editor = cell(page, code).locator(".cm-content")
    editor.scroll_into_view_if_needed()
    editor.click()
    page.keyboard.press("Control+A")
    page.keyboard.insert_text(source)


def run_cell(page, code: str, text: str, timeout: float = 120_000) -> None:
    """Run one cell as a person does (click into it, Shift+Enter), once the kernel is idle,
    and wait until its output contains `text`."""
    page.wait_for_selector(IDLE, timeout=timeout)
    cell(page, code).locator(".cm-content").click()
    page.keyboard.press("Shift+Enter")
    wait_for_output(page, code, text, timeout, again=False)


def menu_titles(page) -> list[str]:
    return [t.strip() for t in page.locator("li.lm-MenuBar-item").all_inner_texts()]
