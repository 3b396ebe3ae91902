"""One run per thread across a fleet: two server processes (tests/web/fleet_server.py under
uvicorn) on one store, a SQLite file and PostgreSQL. A run going on in one refuses a run on the
same thread in the other, which appends nothing; once it ends, the other starts; when its
process is killed, its claim to the thread lapses after the lease's ttl.

The test itself is synchronous (the servers run asyncio under uvicorn; the store is read and
written through ``anyio.run``)."""

from __future__ import annotations

import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import anyio
import httpx
import orjson

from nous_session import SessionActor
from tests.support.processes import Lines, ending
from tests.web.fleet_server import RELEASE
from tests.web.test_agui_streams import run_input
from tests.web.test_agui_workers import store_url  # noqa: F401 - the fixture

HERE = Path(__file__).resolve().parent
# A server on a loaded 2-core host starts in seconds; every wait is bounded by this.
WAIT = 60.0
# Short, so that a killed worker's claim lapses soon; renewed every second by a live one.
TTL = 3.0


@contextmanager
def worker(store: str, log: Path) -> Iterator[tuple[str, subprocess.Popen[str]]]:
    """A fleet_server.py process on a free port: (its URL, the process); killed at the end if
    it still runs."""
    with log.open("w") as errors:
        process = subprocess.Popen(
            [
                sys.executable,
                str(HERE / "fleet_server.py"),
                "--store",
                store,
                "--run-lease-ttl",
                str(TTL),
            ],
            stdout=subprocess.PIPE,
            stderr=errors,
            text=True,
        )
    with process, ending(process):
        line = Lines(process).next(timeout=WAIT)
        assert line.startswith("port "), f"the server did not start: {line!r}\n{log.read_text()}"
        yield f"http://127.0.0.1:{int(line.split()[1])}", process


def stored(store: str, thread: str) -> list[tuple[int, str, dict[str, Any]]]:
    """The thread's events as the store holds them: (seq, type, data)."""

    async def read() -> list[tuple[int, str, dict[str, Any]]]:
        async with SessionActor.open(session_id=thread, store=store, follow=False) as session:
            return [(e.seq, str(e.type), dict(e.data)) for e in session.log.events()]

    return anyio.run(read)


def release(store: str, thread: str, run: str) -> None:
    """Tell the held agent of ``run`` (in whichever process) to finish."""

    async def append() -> None:
        async with SessionActor.open(
            session_id=thread, store=store, follow=False, on_conflict="rebase"
        ) as session:
            await session.append(RELEASE, {"run_id": run})

    anyio.run(append)


def message(identifier: str, text: str) -> dict[str, Any]:
    return {"id": identifier, "role": "user", "content": text}


def events_until(lines: Iterator[str], last: str | None = None) -> list[dict[str, Any]]:
    """The AG-UI events read from ``lines`` up to the first text delta ``last`` (None: to the
    end of the stream)."""
    found = []
    for line in lines:
        if line.startswith("data:"):
            event = orjson.loads(line[5:])
            found.append(event)
            if last is not None and event.get("delta") == last:
                break
    return found


def types(events: list[dict[str, Any]]) -> list[str]:
    return [event["type"] for event in events]


def test_one_run_per_thread_across_two_server_processes(
    store_url: str,  # noqa: F811 - the fixture
    tmp_path: Path,
) -> None:
    store = store_url
    with (
        worker(store, tmp_path / "a.log") as (first, first_process),
        worker(store, tmp_path / "b.log") as (second, _),
        httpx.Client(timeout=WAIT) as client,
    ):
        # A run held open in the first process.
        body = run_input("t1", "r1", [message("u1", "hold")])
        with client.stream("POST", f"{first}/run", json=body) as held:
            lines = held.iter_lines()
            assert "RUN_STARTED" in types(events_until(lines, "working on r1"))
            before = stored(store, "t1")
            # The second process refuses a run on the same thread, and appends nothing.
            asked = [message("u1", "hold"), message("u2", "next")]
            busy = client.post(f"{second}/run", json=run_input("t1", "r2", asked))
            assert busy.status_code == 409, busy.text
            assert "'r1' is going on" in busy.json()["error"]
            assert stored(store, "t1") == before
            release(store, "t1", "r1")
            assert types(events_until(lines))[-1] == "RUN_FINISHED"
        # The first run has ended (its client saw it): the second process starts the next.
        started = client.post(f"{second}/run", json=run_input("t1", "r2", asked))
        assert started.status_code == 200, started.text
        assert "RUN_FINISHED" in started.text
        texts = [data.get("content") for _, _, data in stored(store, "t1")]
        assert texts[len(before) :] == [
            None,  # the release
            "done with r1",
            None,  # the first run's end
            "next",  # the second run's message (its first was appended by the first run)
            None,  # the second run's start
            "working on r2",
            "done with r2",
            None,  # its end
        ]

        # A run held in the first process, which is killed while it runs.
        body = run_input("t1", "r3", [message("u3", "hold")])
        with client.stream("POST", f"{first}/run", json=body) as held:
            events_until(held.iter_lines(), "working on r3")
            busy = client.post(f"{second}/run", json=run_input("t1", "r4", []))
            assert busy.status_code == 409, busy.text
            first_process.kill()
            first_process.wait(timeout=WAIT)
            killed = time.monotonic()
        before = stored(store, "t1")
        # Its claim lapses within the ttl: until then the second refuses, appending nothing.
        after = [message("u4", "after")]
        while (
            answer := client.post(f"{second}/run", json=run_input("t1", "r4", after))
        ).status_code == 409:
            assert stored(store, "t1") == before
            assert time.monotonic() - killed < WAIT, "the dead worker's claim never lapsed"
            time.sleep(0.1)  # the condition is polled: a lease lapses without a signal
        waited = time.monotonic() - killed
        assert answer.status_code == 200, answer.text
        assert "done with r4" in answer.text
        assert waited < TTL + 10, waited
        # The dead worker's run is recorded as failed before the next one starts.
        events = stored(store, "t1")[len(before) :]
        assert [(kind, data.get("run_id")) for _, kind, data in events[:1]] == [
            ("ag_ui.run_error", "r3")
        ]
