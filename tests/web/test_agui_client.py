"""The AG-UI protocol's own JavaScript client is the judge: ``node --test`` runs
tests/web/agui_client/*.test.mjs (``HttpAgent`` from ``@ag-ui/client``, every event checked
against ``@ag-ui/core``'s schemas) against two real server processes (tests/web/agui_server.py
under uvicorn, on free loopback ports) sharing one SQLite store.

Skipped when node or the npm install (``.ci/agui`` runs it) is missing, except in CI, where
that is a failure.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
CLIENT = HERE / "agui_client"
ROOT = HERE.parent.parent
# Bounds: a server on a loaded 2-core host starts in seconds; the Node tests take a few more.
START_TIMEOUT = 60.0
NODE_TIMEOUT = 300.0


def _missing() -> str | None:
    if shutil.which("node") is None:
        return "node is not installed"
    if not (CLIENT / "node_modules" / "@ag-ui" / "client").is_dir():
        return "the AG-UI client is not installed (npm install in tests/web/agui_client)"
    return None


@pytest.fixture(scope="module", autouse=True)
def _node() -> None:
    missing = _missing()
    if missing is None:
        return
    if os.environ.get("CI", "").lower() not in ("", "0", "false"):
        pytest.fail(f"{missing}: .ci/agui installs it")
    pytest.skip(missing)


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def accepting(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=1):
            return True
    except OSError:
        return False


@contextmanager
def server(store: str, log: Path, *options: str) -> Iterator[str]:
    """A server process on a free port, stopped gracefully (SIGTERM) at the end."""
    port = free_port()
    command = [sys.executable, str(HERE / "agui_server.py"), "--store", store, "--port", str(port)]
    with log.open("wb") as output:
        process = subprocess.Popen(
            [*command, *options],
            cwd=ROOT,
            stdout=output,
            stderr=subprocess.STDOUT,
        )
    try:
        deadline = time.monotonic() + START_TIMEOUT
        while not accepting(port):
            if process.poll() is not None:
                raise AssertionError(f"the server exited:\n{log.read_text()}")
            if time.monotonic() > deadline:
                raise AssertionError(f"the server did not start:\n{log.read_text()}")
            time.sleep(0.05)
        yield f"http://127.0.0.1:{port}"
    finally:
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


def test_the_agui_client_runs_resumes_and_hydrates_against_two_server_processes(
    tmp_path: Path,
) -> None:
    store = f"sqlite:///{tmp_path / 'agui.sqlite3'}"
    with ExitStack() as stack:
        first = stack.enter_context(server(store, tmp_path / "server-a.log"))
        second = stack.enter_context(server(store, tmp_path / "server-b.log"))
        node = shutil.which("node")
        assert node is not None
        tests = sorted(str(path) for path in CLIENT.glob("*.test.mjs"))
        assert tests
        result = subprocess.run(
            [node, "--test", "--test-reporter=spec", *tests],
            cwd=CLIENT,
            env={
                **os.environ,
                "AGUI_SERVER_A": first,
                "AGUI_SERVER_B": second,
                "AGUI_STORE": store,
                "AGUI_PYTHON": sys.executable,
            },
            capture_output=True,
            text=True,
            timeout=NODE_TIMEOUT,
            check=False,
        )
    logs = "\n".join(f"{p.name}:\n{p.read_text()}" for p in sorted(tmp_path.glob("*.log")))
    assert result.returncode == 0, f"{result.stdout}\n{result.stderr}\n{logs}"
    assert "# fail 0" in result.stdout or "fail 0" in result.stdout, result.stdout
    assert "Traceback" not in logs, logs
