"""A page that uses the AG-UI protocol's own client, in a real browser: Debian's Chromium,
headless, driven by Selenium through Debian's chromedriver.

The page (tests/web/agui_client/page: ``page.mjs`` imports ``HttpAgent`` from ``@ag-ui/client``, and
esbuild, from the same npm install, bundles it for the browser here, at test time) runs the
scripted agent of tests/web/agui_server.py, which streams a tool call's arguments and its
answer live, and renders the conversation at every change. The test checks that the page
rendered the arguments while they streamed, and that the conversation it shows once the run
is over is the session's surface as the store holds it.

Skipped when Chromium, chromedriver, node or the npm install is missing, except in CI, where
that fails (``.ci/chromium`` and ``.ci/agui`` install them).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anyio
import pytest

from nous_session import SessionActor
from nous_session.stores.sqlite import SQLiteStore
from nous_session.web._agui import agui_messages
from tests.web.test_agui_client import CLIENT, server
from tests.web.test_web_view import CHROMEDRIVER, CHROMIUM, chromium, wait_for

PAGE = CLIENT / "page"
ESBUILD = CLIENT / "node_modules" / ".bin" / "esbuild"


def _missing() -> str | None:
    if not CHROMIUM or not CHROMEDRIVER:
        return "chromium is not installed" if not CHROMIUM else "chromedriver is not installed"
    if shutil.which("node") is None:
        return "node is not installed"
    if not (CLIENT / "node_modules" / "@ag-ui" / "client").is_dir() or not ESBUILD.exists():
        return "the AG-UI client or esbuild is not installed (npm ci in tests/web/agui_client)"
    return None


@pytest.fixture(scope="module", autouse=True)
def _tools() -> None:
    missing = _missing()
    if missing is None:
        return
    if os.environ.get("CI", "").lower() not in ("", "0", "false"):
        pytest.fail(f"{missing}: .ci/chromium and .ci/agui install them")
    pytest.skip(missing)


@pytest.fixture
def page(tmp_path: Path) -> Path:
    """The page's folder: its HTML, and page.mjs bundled with the AG-UI client as page.js."""
    built = tmp_path / "page"
    built.mkdir()
    shutil.copy(PAGE / "index.html", built / "index.html")
    bundled = subprocess.run(
        [
            str(ESBUILD),
            str(PAGE / "page.mjs"),
            "--bundle",
            "--format=esm",
            "--platform=browser",
            "--log-level=warning",
            f"--outfile={built / 'page.js'}",
        ],
        cwd=CLIENT,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert bundled.returncode == 0, bundled.stderr
    return built


@pytest.fixture
def browser(tmp_path: Path) -> Iterator[Any]:
    with chromium(tmp_path) as driver:
        yield driver


def rendered(driver: Any) -> dict[str, Any]:
    """What the page shows: its state, the messages it rendered, and what it counted."""
    return dict(
        driver.execute_script(
            """
            const body = document.body;
            return {
                state: body.dataset.state,
                problem: document.getElementById("problem").textContent,
                argumentDeltas: Number(body.dataset.argumentDeltas || 0),
                textDeltas: Number(body.dataset.textDeltas || 0),
                partialArguments: Number(body.dataset.partialArguments || 0),
                messages: [...document.querySelectorAll("#messages > li")].map((li) => ({
                    id: li.dataset.id,
                    role: li.dataset.role,
                    content: li.querySelector(".content").textContent,
                    toolCallId: li.dataset.toolCallId || null,
                    calls: [...li.querySelectorAll(".calls > li")].map((call) => [
                        call.dataset.callId,
                        call.dataset.name,
                        call.querySelector("code").textContent,
                    ]),
                })),
            };
            """
        )
    )


def surface(path: Path, thread: str) -> list[dict[str, Any]]:
    """The session's surface as the store holds it, in the form the page renders."""

    async def read() -> list[dict[str, Any]]:
        async with (
            SQLiteStore(path) as store,
            SessionActor.open(session_id=thread, store=store, follow=False) as session,
        ):
            messages = agui_messages(session.log)
        return [
            {
                "id": message.id,
                "role": message.role,
                "content": message.content if isinstance(message.content, str) else "",
                "toolCallId": getattr(message, "tool_call_id", None),
                "calls": [
                    [call.id, call.function.name, call.function.arguments]
                    for call in getattr(message, "tool_calls", None) or []
                ],
            }
            for message in messages
        ]

    return anyio.run(read)


def test_a_page_using_the_agui_client_renders_the_sessions_surface(
    tmp_path: Path, page: Path, browser: Any
) -> None:
    path = tmp_path / "page.sqlite3"
    thread = f"page-{uuid.uuid4()}"
    with server(f"sqlite:///{path}", tmp_path / "server.log", "--page", str(page)) as base:
        browser.get(f"{base}/page/index.html?thread={thread}&say=slow%3A+render+me")
        shown = wait_for(
            "the run to end on the page",
            lambda: (state := rendered(browser))["state"] in ("done", "failed") and state,
        )
    assert shown["state"] == "done", shown["problem"]
    # It rendered live: the arguments came in several deltas, and were on screen unfinished.
    assert shown["argumentDeltas"] > 1
    assert shown["textDeltas"] > 1
    assert shown["partialArguments"] > 0
    expected = surface(path, thread)
    assert [m["role"] for m in expected] == ["user", "assistant", "tool", "assistant"]
    assert shown["messages"] == expected
    assert expected[-1]["content"] == "You said: slow: render me"
