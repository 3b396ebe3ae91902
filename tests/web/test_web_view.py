"""The live web view (examples/web) in a real browser: Debian's Chromium, headless, driven by
Selenium through Debian's chromedriver.

The server runs as it would for a user, under uvicorn in a subprocess on a free loopback port,
over a SQLite file. The test appends turns after the page loaded and waits until the page shows
them; stops the server (SIGTERM, then once more SIGKILL), appends while it is down, starts it
again on the same port, appends again, and checks each time that the page shows every event
exactly once, in seq order, with no gap (the seqs read from the DOM), that the browser resumed
with ``Last-Event-ID`` right after the last event it had, and that the surface it shows,
compaction summaries included, is the server's.

This test is synchronous: the browser and the server are other processes, and nothing here
awaits. The server itself pins asyncio, because uvicorn runs on asyncio (and sse-starlette's
shutdown watcher is an asyncio task); the library under it runs on either backend, as the rest
of the suite checks.

Skipped when Chromium or chromedriver is missing, except in CI (``CI`` set), where that fails:
``.ci/chromium`` installs both.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, TypeVar

import pytest

ROOT = Path(__file__).resolve().parents[2]
SESSION = "web-test"
# Bounds for the waits on a condition (never a bare sleep): generous for a loaded 2-core host.
START_TIMEOUT = 60.0
SHOW_TIMEOUT = 60.0
CHROMIUM = shutil.which("chromium")
CHROMEDRIVER = shutil.which("chromedriver")
# Chromium without a sandbox, GPU, or any network of its own (the machine has no internet).
CHROMIUM_FLAGS = (
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--disable-dev-shm-usage",
    "--window-size=1280,820",
)

T = TypeVar("T")


@pytest.fixture(scope="module", autouse=True)
def _chromium() -> None:
    if CHROMIUM and CHROMEDRIVER:
        return
    missing = "chromium" if not CHROMIUM else "chromedriver"
    if os.environ.get("CI", "").lower() not in ("", "0", "false"):
        pytest.fail(f"{missing} is not installed (.ci/chromium installs it)")
    pytest.skip(f"{missing} is not installed (apt-get install chromium chromium-driver)")


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def wait_for(what: str, condition: Callable[[], T], timeout: float = SHOW_TIMEOUT) -> T:
    """Poll ``condition`` until it returns something truthy, at most ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        value = condition()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout:.0f} s waiting for {what}")
        time.sleep(0.05)


def app_command(store: str, *args: str) -> list[str]:
    return [sys.executable, "-m", "examples.web.app", "--store", store, *args]


class Server:
    """``python -m examples.web.app serve`` under uvicorn, started and stopped on one port."""

    def __init__(self, store: str, port: int, logs: Path) -> None:
        self.store = store
        self.port = port
        self.logs = logs
        self.starts = 0
        self.process: subprocess.Popen[bytes] | None = None
        self.base = f"http://127.0.0.1:{port}"

    @property
    def log(self) -> Path:
        return self.logs / f"server-{self.starts}.log"

    def start(self) -> None:
        self.starts += 1
        with self.log.open("wb") as log:
            self.process = subprocess.Popen(
                app_command(self.store, "serve", "--host", "127.0.0.1", "--port", str(self.port)),
                cwd=ROOT,
                stdout=log,
                stderr=subprocess.STDOUT,
                env={**os.environ, "PYTHONWARNINGS": "error::ResourceWarning"},
            )
        wait_for(f"the server on port {self.port}", self._accepting, START_TIMEOUT)

    def _accepting(self) -> bool:
        assert self.process is not None
        if self.process.poll() is not None:
            raise AssertionError(f"the server exited:\n{self.log.read_text()}")
        try:
            with socket.create_connection(("127.0.0.1", self.port), timeout=1):
                return True
        except OSError:
            return False

    def stop(self) -> None:
        """A graceful stop (SIGTERM), as a service manager does it."""
        process, self.process = self.process, None
        if process is None:
            return
        process.send_signal(signal.SIGTERM)
        try:
            code = process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
            raise AssertionError(f"the server did not stop:\n{self.log.read_text()}") from None
        # uvicorn shuts down cleanly, then re-raises the signal so the exit status tells.
        assert code in (0, -signal.SIGTERM), self.log.read_text()
        # Nothing went wrong on the way down: the streams were ended, not dropped.
        log = self.log.read_text()
        assert "Traceback" not in log, log
        assert "ERROR" not in log, log

    def crash(self) -> None:
        """SIGKILL: the streams are torn, not ended."""
        process, self.process = self.process, None
        assert process is not None
        process.kill()
        process.wait()

    def request(self, method: str, path: str) -> Any:
        request = urllib.request.Request(self.base + path, method=method)
        with urllib.request.urlopen(request, timeout=60) as response:
            return json.load(response)

    def append(self, turns: int) -> int:
        """Append turns through the running server; the session's count after them (and after
        the compactions they triggered)."""
        return int(self.request("POST", f"/sessions/{SESSION}/turns?count={turns}")["count"])


@pytest.fixture
def server(tmp_path: Path) -> Iterator[Server]:
    server = Server(f"sqlite:///{tmp_path / 'web.sqlite3'}", free_port(), tmp_path)
    try:
        yield server
    finally:
        server.stop()


@contextmanager
def chromium(tmp_path: Path) -> Iterator[Any]:
    """A headless Chromium driven through chromedriver, its profile in ``tmp_path`` (the
    browser tests' one way to start it)."""
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = str(CHROMIUM)
    for flag in CHROMIUM_FLAGS:
        options.add_argument(flag)
    options.add_argument(f"--user-data-dir={tmp_path / 'chromium-profile'}")
    service = Service(str(CHROMEDRIVER), log_output=subprocess.DEVNULL)
    driver = webdriver.Chrome(options=options, service=service)
    try:
        yield driver
    finally:
        driver.quit()


@pytest.fixture
def browser(tmp_path: Path) -> Iterator[Any]:
    with chromium(tmp_path) as driver:
        yield driver


def page_state(driver: Any) -> dict[str, Any]:
    """What the page shows: the seqs of its event rows in order, and of its surface."""
    return dict(
        driver.execute_script(
            """
            const seqs = (selector) => [...document.querySelectorAll(selector)]
                .map((li) => Number(li.dataset.seq));
            return {
                events: seqs("#events li"),
                compactions: seqs("#events li.compaction"),
                surface: seqs("#surface li"),
                summaries: seqs("#surface li.summary"),
                surfaceAt: Number(document.getElementById("surface-at").textContent),
                state: document.getElementById("state").textContent,
                reconnects: Number(document.getElementById("reconnects").textContent),
                problems: document.getElementById("problems").textContent,
            };
            """
        )
    )


def shows_through(driver: Any, count: int) -> Callable[[], dict[str, Any] | None]:
    """A condition: the page shows events up to seq ``count - 1`` and the surface at it."""

    def condition() -> dict[str, Any] | None:
        state = page_state(driver)
        events = state["events"]
        # Until its first surface is drawn the page shows a dash there (None: not a number).
        surface_at = state["surfaceAt"]
        done = (
            events
            and events[-1] >= count - 1
            and surface_at is not None
            and surface_at >= count - 1
        )
        return state if done else None

    return condition


def check_page(driver: Any, server: Server, count: int) -> dict[str, Any]:
    """Wait until the page shows ``count`` events, then check them and its surface."""
    state = wait_for(f"the page to show seqs 0..{count - 1}", shows_through(driver, count))
    assert state["events"] == list(range(count)), "each event once, in order, no gap"
    assert state["problems"] == ""
    surface = server.request("GET", f"/sessions/{SESSION}/surface")
    assert surface["count"] == count
    assert state["surface"] == [entry["seq"] for entry in surface["entries"]]
    return state


def test_the_page_follows_the_session_across_a_server_restart(
    server: Server, browser: Any, tmp_path: Path
) -> None:
    server.start()
    browser.get(f"{server.base}/sessions/{SESSION}")
    wait_for("the stream to open", lambda: page_state(browser)["state"] == "live")
    assert page_state(browser)["events"] == []

    # Appended after the page loaded: streamed to it as they are committed.
    count = server.append(2)
    check_page(browser, server, count)
    # Enough for compactions (more than 12 messages on the surface): marked as they land.
    count = server.append(8)
    state = check_page(browser, server, count)
    assert state["compactions"], "a compaction landed and the log shows it"
    assert state["summaries"], "the surface shows the summary"
    if shot := os.environ.get("NOUS_WEB_SCREENSHOT"):
        browser.save_screenshot(shot)
    check_first_paint(browser, server, count)

    # The server stops; the page notices and keeps trying.
    before_stop = count
    server.stop()
    wait_for("the page to see the server gone", lambda: page_state(browser)["state"] != "live")
    # Written while the server is down, straight to the SQLite file.
    append_offline(server, 5)
    server.start()
    # And after it is back.
    count = server.append(3)
    state = check_page(browser, server, count)
    assert count > before_stop
    assert state["reconnects"] == 1
    # The browser came back with Last-Event-ID: the seq of the last event it had.
    assert resumed_at(before_stop) in server.log.read_text()

    # Once more after a crash: the connection is torn instead of ended.
    before_crash = count
    server.crash()
    wait_for("the page to see the server gone", lambda: page_state(browser)["state"] != "live")
    append_offline(server, 2)
    server.start()
    count = server.append(1)
    state = check_page(browser, server, count)
    assert state["reconnects"] == 2
    assert resumed_at(before_crash) in server.log.read_text()
    assert len(state["compactions"]) >= 3, "compactions before, while and after it was down"


def check_first_paint(browser: Any, server: Server, count: int) -> None:
    """A page loaded on a session with history shows its surface in its first paint: the
    surface comes with the page. Proved with the stream and the surface fetch blocked, so
    nothing but the page itself can have drawn it."""
    browser.execute_cdp_cmd("Network.enable", {})
    browser.execute_cdp_cmd("Network.setBlockedURLs", {"urls": ["*/events*", "*/surface*"]})
    try:
        browser.get(f"{server.base}/sessions/{SESSION}")
        first = page_state(browser)  # no wait: what the page showed once loaded
    finally:
        browser.execute_cdp_cmd("Network.setBlockedURLs", {"urls": []})
    surface = server.request("GET", f"/sessions/{SESSION}/surface")
    assert first["events"] == [], "the stream was blocked"
    assert first["surfaceAt"] == count - 1
    assert first["surface"] == [entry["seq"] for entry in surface["entries"]]
    assert first["summaries"], "with the summary, marked"
    # The summary is shown whole, line by line, with the messages it covers.
    shown = browser.execute_script(
        """const li = document.querySelector("#surface li.summary");
        return [li.querySelector(".text").textContent, li.querySelector(".badge").textContent];"""
    )
    (entry,) = [entry for entry in surface["entries"] if entry["replace"] == "compaction"]
    assert shown == [entry["text"], f"{entry['covers']} messages"]
    assert shown[0].startswith(f"[Compacted {entry['covers']} earlier messages]\n")
    # Unblocked, a new load follows the stream as before.
    browser.get(f"{server.base}/sessions/{SESSION}")
    check_page(browser, server, count)


def append_offline(server: Server, turns: int) -> None:
    subprocess.run(
        app_command(server.store, "append", SESSION, str(turns)),
        cwd=ROOT,
        check=True,
        capture_output=True,
        timeout=120,
    )


def resumed_at(seq: int) -> str:
    """What the server logs when a stream resumes after ``seq`` from ``Last-Event-ID``."""
    return f"stream of {SESSION!r} from seq {seq} (Last-Event-ID)"
