"""One compactor per session across processes, attacked with real signals: a holder stopped
(SIGSTOP) or killed (SIGKILL) in the middle of its summary, while another holder compacts or
an erasure lands. The stopped holder's turn lapses after ``turn_ttl``; when it goes on, its
summary was planned on a session that changed, and must not be committed.

The worker is ``tests/support/compacting_worker.py``; the other holder is an actor here.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import Iterator, Sequence
from pathlib import Path

import anyio
import anyio.to_thread
import pytest

from nous_session import CompactionPolicy, Message, SessionActor, open_store
from nous_session.event import EventType
from tests.support.processes import Lines, shared_store_url

pytestmark = pytest.mark.anyio
WORKER = Path(__file__).parents[1] / "support" / "compacting_worker.py"
TTL = 1.0  # the worker's and this test's turn_ttl: a stopped holder's turn lapses in a second
TURNS = 6  # the worker appends "w 0" .. "w 5"; its first summary covers "w 0" .. "w 3"
SESSION = "fleet"


@pytest.fixture(params=["sqlite", "postgres", "pgbouncer"])
def url(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    """A store URL every process reaches: a SQLite file, a PostgreSQL schema of the test's
    own (dropped after it), and the same through PgBouncer in transaction pooling mode."""
    yield from shared_store_url(request.param, tmp_path, "fleet")


class Worker:
    """The compacting worker process, its stdout read with deadlines."""

    def __init__(self, url: str) -> None:
        self.process = subprocess.Popen(
            [sys.executable, "-W", "error", str(WORKER), url, SESSION, str(TURNS), str(TTL)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        self.lines = Lines(self.process)

    def __enter__(self) -> Worker:
        return self

    def __exit__(self, *exc_info: object) -> None:
        """Kill the worker if it still runs (a failing test never hangs on it), and close its
        pipes."""
        if self.process.poll() is None:
            self.process.kill()
        self.process.wait(timeout=30)
        for pipe in (self.process.stdin, self.process.stdout):
            if pipe is not None:
                pipe.close()

    async def line(self, prefix: str) -> str:
        """The next line that starts with ``prefix`` (others are skipped); fails after 30 s."""
        while True:
            line = await anyio.to_thread.run_sync(self.lines.next, 30.0)
            assert line, f"the worker ended before it printed {prefix!r}"
            if line.startswith(prefix):
                return line.rstrip("\n")[len(prefix) :]

    async def summarizing(self) -> str:
        """Wait until the worker is ready and its summarizer has been called (in either
        order); the contents it was given."""
        first = await self.line("")
        if first.startswith("summarizing "):
            await self.line("ready")
            return first[len("summarizing ") :]
        assert first == "ready", first
        return await self.line("summarizing ")

    def send(self, line: str) -> None:
        assert self.process.stdin is not None
        self.process.stdin.write(f"{line}\n")
        self.process.stdin.flush()

    async def stats(self) -> dict[str, int]:
        """Let the stopped worker go on, then its counters once its compactions are over."""
        self.send("go")
        os.kill(self.process.pid, signal.SIGCONT)
        self.send("stats")
        run, stale, failed, calls = map(int, (await self.line("stats ")).split())
        return {"run": run, "stale": stale, "failed": failed, "calls": calls}


def summaries(events: Sequence[object]) -> list[str]:
    """The contents of every summary the events hold (committed compactions)."""
    return [
        str(event.data.get("content", ""))  # type: ignore[attr-defined]
        for event in events
        if event.type is EventType.SYSTEM_MESSAGE  # type: ignore[attr-defined]
        and str(event.data.get("content", "")).startswith("SUMMARY of ")  # type: ignore[attr-defined]
    ]


async def compact_here(url: str, calls: list[int]) -> list[str]:
    """Hold the session here too and append until this holder has compacted it (it can only
    once the other holder's turn lapsed); the summaries on its surface then."""

    async def summarize(messages: Sequence[Message]) -> str:
        calls.append(len(messages))
        return "SUMMARY of " + "|".join(message.text for message in messages)

    policy = CompactionPolicy(keep_last=2, every=TURNS - 1, summarizer=summarize, turn_ttl=TTL)
    async with SessionActor.open(session_id=SESSION, store=url, compaction=policy) as here:
        with anyio.fail_after(30):
            turn = 0
            while here.statistics().compactions_run == 0:
                await here.add_message(Message.user(f"here {turn}"))
                turn += 1
                # A compaction that found the turn taken waits for the surface to grow: one
                # message per tenth of the turn's ttl, until the stopped holder's turn lapses.
                await here.wait_for_compaction()
                await anyio.sleep(TTL / 10)
        return [
            message.text for message in here.messages() if message.text.startswith("SUMMARY of ")
        ]


async def test_a_holder_stopped_mid_summary_loses_its_turn_and_commits_nothing(url: str) -> None:
    """The worker is stopped while its summarizer runs; this holder takes the lapsed turn and
    compacts; the worker goes on, and its summary, planned before, is stale: one summary on
    the surface, the worker's never committed."""
    with Worker(url) as worker:
        planned = await worker.summarizing()
        assert planned == "w 0|w 1|w 2|w 3"
        os.kill(worker.process.pid, signal.SIGSTOP)
        calls: list[int] = []
        surface = await compact_here(url, calls)
        assert len(surface) == 1, surface
        stats = await worker.stats()
    assert stats["stale"] >= 1, stats
    assert stats["failed"] == 0, stats
    async with open_store(url) as store:
        events = await store.load(SESSION)
    assert f"SUMMARY of {planned}" not in summaries(events)


async def test_a_holder_killed_mid_summary_gives_its_turn_up_after_its_ttl(url: str) -> None:
    """The worker is killed (SIGKILL) while its summarizer runs, holding the turn: this holder
    compacts once the turn has lapsed."""
    with Worker(url) as worker:
        await worker.summarizing()
        worker.process.kill()
        worker.process.wait(timeout=30)
        calls: list[int] = []
        surface = await compact_here(url, calls)
    assert len(surface) == 1, surface
    assert len(calls) == 1, calls


async def test_an_erasure_while_a_holder_summarises_keeps_the_erased_text_out(url: str) -> None:
    """The worker is stopped while its summarizer holds "w 1"; another process erases "w 1";
    the worker goes on: its summary (which quotes "w 1") is stale, and the next one is planned
    on the erased session. No stored event holds "w 1" any more."""
    with Worker(url) as worker:
        planned = await worker.summarizing()
        assert "w 1" in planned
        os.kill(worker.process.pid, signal.SIGSTOP)
        async with open_store(url) as store:
            erased = await store.erase(SESSION, [1], reason="request")
        assert erased.erased == (1,), erased
        stats = await worker.stats()
    assert stats["stale"] >= 1, stats
    assert stats["failed"] == 0, stats
    async with open_store(url) as store:
        events = await store.load(SESSION)
    assert summaries(events), "the worker never compacted the erased session"
    leaks = [event.seq for event in events if "w 1" in repr(event.data)]
    assert not leaks, f"events {leaks} hold the erased text"
