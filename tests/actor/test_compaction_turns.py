"""One compactor per session across every holder (issue 33): the stores' leases, and actors in
one process and in two that share a session and call the summarizer once per summary."""

from __future__ import annotations

import os
import subprocess
import sys
import uuid
from collections.abc import Callable, Sequence
from pathlib import Path

import anyio
import anyio.lowlevel
import pytest

from nous_session import CompactionPolicy, LeasingStore, Message, SessionActor, Store
from nous_session.stores import MemoryStore
from nous_session.stores.base import supports

pytestmark = pytest.mark.anyio
POSTGRES_URL = os.environ.get("NOUS_SESSION_TEST_POSTGRES")


# The stores' leases --------------------------------------------------------------------------


async def test_a_lease_has_one_holder_at_a_time(store: Store) -> None:
    assert supports(store, LeasingStore)
    leases: LeasingStore = store  # type: ignore[assignment]  # checked by supports() above
    assert await leases.lease("s", "compaction", holder="a", ttl=30)
    assert not await leases.lease("s", "compaction", holder="b", ttl=30)
    assert await leases.lease("s", "compaction", holder="a", ttl=30)  # renewed
    assert await leases.lease("s", "other", holder="b", ttl=30)  # another name is another lease
    assert await leases.lease("t", "compaction", holder="b", ttl=30)  # another session too
    await leases.release("s", "compaction", holder="b")  # not b's: nothing happens
    assert not await leases.lease("s", "compaction", holder="b", ttl=30)
    await leases.release("s", "compaction", holder="a")
    assert await leases.lease("s", "compaction", holder="b", ttl=30)


async def test_a_lease_lapses_after_its_ttl(store: Store) -> None:
    """A holder that dies gives the turn up: its lease lapses by itself."""
    leases: LeasingStore = store  # type: ignore[assignment]  # every built-in store has leases
    assert await leases.lease("s", "compaction", holder="dead", ttl=0.2)
    assert not await leases.lease("s", "compaction", holder="alive", ttl=30)
    await anyio.sleep(0.3)  # past the dead holder's ttl (what is tested is the lapse itself)
    assert await leases.lease("s", "compaction", holder="alive", ttl=30)
    assert not await leases.lease("s", "compaction", holder="dead", ttl=0.2)


@pytest.mark.parametrize(
    ("arguments", "message"),
    [
        ({"session_id": "", "name": "n", "holder": "h", "ttl": 1}, "session"),
        ({"session_id": "s", "name": "", "holder": "h", "ttl": 1}, "name"),
        ({"session_id": "s", "name": "n", "holder": 7, "ttl": 1}, "holder"),
        ({"session_id": "s", "name": "n", "holder": "h", "ttl": 0}, "ttl"),
        ({"session_id": "s", "name": "n", "holder": "h", "ttl": True}, "ttl"),
    ],
)
async def test_a_malformed_lease_call_is_refused(
    store: Store, arguments: dict[str, object], message: str
) -> None:
    leases: LeasingStore = store  # type: ignore[assignment]  # every built-in store has leases
    rest = dict(arguments)
    session_id, name = rest.pop("session_id"), rest.pop("name")
    with pytest.raises(ValueError, match=message):
        await leases.lease(session_id, name, **rest)  # type: ignore[arg-type]


# Actors sharing a session take turns --------------------------------------------------------


class CountingSummarizer:
    """Stands for an LLM call: counts its calls and takes a while."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.calls = 0

    async def __call__(self, messages: Sequence[Message]) -> str:
        self.calls += 1
        await anyio.sleep(0.02)
        return f"SUMMARY by {self.name} #{self.calls} of {len(messages)}"


def summaries(events: object) -> int:
    return sum(
        1
        for event in events  # type: ignore[attr-defined]
        if str(event.data.get("content", "")).startswith("SUMMARY by ")
    )


async def test_two_actors_on_one_session_pay_for_each_summary_once(
    stores: Callable[[], Store],
) -> None:
    """Two actors hold one session with background compaction (default options); each appends
    60 messages. The summarizer runs once per committed summary (it ran in both, 2x)."""
    first_store, second_store = stores(), stores()
    counters = [CountingSummarizer("first"), CountingSummarizer("second")]
    try:
        async with (
            SessionActor.open(
                session_id="shared",
                store=first_store,
                compaction=CompactionPolicy(keep_last=4, every=10, summarizer=counters[0]),
            ) as first,
            SessionActor.open(
                session_id="shared",
                store=second_store,
                compaction=CompactionPolicy(keep_last=4, every=10, summarizer=counters[1]),
            ) as second,
        ):

            async def talk(actor: SessionActor, name: str) -> None:
                for turn in range(60):
                    await actor.add_message(Message.user(f"{name} {turn}"))
                    await anyio.sleep(0.002)

            async with anyio.create_task_group() as group:
                group.start_soon(talk, first, "first")
                group.start_soon(talk, second, "second")
            await first.wait_for_compaction()
            await second.wait_for_compaction()
        committed = summaries(await first_store.load("shared"))
    finally:
        await first_store.aclose()
        if second_store is not first_store:
            await second_store.aclose()
    calls = sum(counter.calls for counter in counters)
    assert committed >= 4, f"only {committed} summaries"
    assert calls <= committed * 1.1, f"{calls} summarizer calls for {committed} summaries"


_WORKER = """
import sys
import anyio
import anyio.lowlevel
from nous_session import CompactionPolicy, Message, SessionActor

async def main(url, name, turns):
    calls = 0
    async def summarize(messages):
        nonlocal calls
        calls += 1
        await anyio.sleep(0.02)
        return f"SUMMARY by {name} #{calls} of {len(messages)}"
    policy = CompactionPolicy(keep_last=4, every=10, summarizer=summarize)
    async with SessionActor.open(session_id="shared", store=url, compaction=policy) as chat:
        for turn in range(turns):
            await chat.add_message(Message.user(f"{name} {turn}"))
            await anyio.sleep(0.003)
        await chat.wait_for_compaction()
    print(calls)

anyio.run(main, sys.argv[1], sys.argv[2], int(sys.argv[3]))
"""


@pytest.mark.parametrize("kind", ["sqlite", "postgres"])
def test_two_processes_on_one_session_pay_for_each_summary_once(tmp_path: Path, kind: str) -> None:
    """Two processes hold one session with background compaction and a summarizer that stands
    for an LLM call; each appends 60 messages. The summarizer ran 12 times for 6 summaries."""
    if kind == "sqlite":
        url = f"sqlite:///{tmp_path / 'fleet.sqlite3'}"
        schema = None
    else:
        if not POSTGRES_URL:
            pytest.skip("no PostgreSQL server: set NOUS_SESSION_TEST_POSTGRES")
        psycopg = pytest.importorskip("psycopg")
        schema = f"p_{uuid.uuid4().hex[:12]}"
        separator = "&" if "?" in POSTGRES_URL else "?"
        url = f"{POSTGRES_URL}{separator}schema={schema}"
    try:
        workers = [
            subprocess.Popen(
                [sys.executable, "-W", "error", "-c", _WORKER, url, name, "60"],
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
            )
            for name in ("one", "two")
        ]
        calls = 0
        for worker in workers:
            try:
                out, err = worker.communicate(timeout=120)
            finally:
                worker.kill()
            assert worker.returncode == 0, err
            calls += int(out.strip())

        async def stored() -> int:
            async with SessionActor.open(session_id="shared", store=url) as chat:
                return summaries(chat.log.events())

        committed = anyio.run(stored)
    finally:
        if schema is not None:
            with psycopg.connect(POSTGRES_URL, autocommit=True) as connection:
                connection.execute(f"DROP SCHEMA IF EXISTS {schema} CASCADE")
    assert committed >= 4, f"only {committed} summaries"
    assert calls <= committed * 1.1, f"{calls} summarizer calls for {committed} summaries"


class _GatedLeases(MemoryStore):
    """A memory store whose lease waits (shielded, as a store's thread would finish) until the
    test opens the gate."""

    def __init__(self) -> None:
        super().__init__()
        self.asked = anyio.Event()
        self.gate = anyio.Event()

    async def lease(self, session_id: str, name: str, *, holder: str, ttl: float) -> bool:
        self.asked.set()
        with anyio.CancelScope(shield=True):
            await self.gate.wait()
        return await super().lease(session_id, name, holder=holder, ttl=ttl)


async def test_a_session_closing_while_its_compaction_takes_the_turn_closes_cleanly() -> None:
    """The owner's block is cancelled while the compaction waits for its turn, and the turn is
    granted as the session closes: the runner's catch-up is refused with SessionClosedError,
    which ends that compaction quietly (it escaped in an exception group beside the renewer's
    cancellation and took the session's task group down with it: a fault test found it)."""
    store = _GatedLeases()
    policy = CompactionPolicy(keep_last=2, every=3)
    owner = anyio.CancelScope()

    async def own(ready: anyio.Event, holder: list[SessionActor]) -> None:
        with owner:
            async with SessionActor.open(
                session_id="closing", store=store, compaction=policy
            ) as session:
                holder.append(session)
                ready.set()
                await anyio.sleep_forever()

    async with anyio.create_task_group() as group:
        ready = anyio.Event()
        holder: list[SessionActor] = []
        group.start_soon(own, ready, holder)
        await ready.wait()
        session = holder[0]
        for turn in range(5):
            await session.add_message(Message.user(f"m{turn}"))
        with anyio.fail_after(5):
            await store.asked.wait()  # the compaction is waiting for its turn
        owner.cancel()
        with anyio.fail_after(5):
            while not session._state.closing:  # the owner's block is leaving
                await anyio.lowlevel.checkpoint()
        store.gate.set()
    assert owner.cancelled_caught
