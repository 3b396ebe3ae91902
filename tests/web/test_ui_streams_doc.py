"""docs/ui-streams.md stays true: its FastAPI app is under 40 lines, and, served by uvicorn in a
process of its own, it runs its agent for the user the authorization lets in and refuses the
others."""

from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx
import orjson

ROOT = Path(__file__).resolve().parent.parent.parent
PAGE = ROOT / "docs" / "ui-streams.md"
START_TIMEOUT = 60.0


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def wait_accepting(process: subprocess.Popen[bytes], port: int, log: Path) -> None:
    deadline = time.monotonic() + START_TIMEOUT
    while True:
        if process.poll() is not None:
            raise AssertionError(f"the app exited:\n{log.read_text()}")
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=1):
                return
        except OSError:
            if time.monotonic() > deadline:
                raise AssertionError(f"the app did not start:\n{log.read_text()}") from None
            time.sleep(0.05)


def types(response: httpx.Response) -> list[str]:
    return [
        orjson.loads(line[len("data: ") :])["type"]
        for line in response.text.splitlines()
        if line.startswith("data: ")
    ]


def test_the_pages_fastapi_app_streams_its_agent_to_the_user_it_authorizes(
    tmp_path: Path,
) -> None:
    code = re.findall(r"```python\n(.*?)```", PAGE.read_text(encoding="utf-8"), re.S)[0]
    assert len(code.splitlines()) < 40
    (tmp_path / "app.py").write_text(code, encoding="utf-8")
    port = free_port()
    log = tmp_path / "uvicorn.log"
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]),
    }
    with log.open("wb") as output:
        process = subprocess.Popen(
            [sys.executable, "-m", "uvicorn", "app:app", "--port", str(port)],
            cwd=tmp_path,
            env=env,
            stdout=output,
            stderr=subprocess.STDOUT,
        )
    try:
        wait_accepting(process, port, log)
        base = f"http://127.0.0.1:{port}/agent"
        hello = {"id": "m1", "role": "user", "content": "hello"}
        body = {"threadId": "alice/1", "runId": "r1", "messages": [hello]}
        with httpx.Client(timeout=30) as client:
            assert client.post(f"{base}/run", json=body).status_code == 403
            bob = client.post(f"{base}/run", json=body, headers={"x-user": "bob"})
            assert bob.status_code == 403
            run = client.post(f"{base}/run", json=body, headers={"x-user": "alice"})
            assert run.status_code == 200
            assert types(run)[0] == "RUN_STARTED"
            assert "TOOL_CALL_RESULT" in types(run)
            assert types(run)[-1] == "RUN_FINISHED"
            assert "Three answers to 'hello'." in run.text
            connect = client.get(
                f"{base}/connect", params={"thread_id": "alice/1"}, headers={"x-user": "alice"}
            )
            assert types(connect) == ["RUN_STARTED", "MESSAGES_SNAPSHOT", "RUN_FINISHED"]
    finally:
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
    assert (tmp_path / "threads.sqlite3").exists()
    assert "Traceback" not in log.read_text(), log.read_text()
