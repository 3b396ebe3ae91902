"""A run whose claim to its thread lapsed stops, and leaves the thread to the run that took it.

Two workers (each a :class:`SessionStreams` with its own registry) on one store: memory (one
store object), a SQLite file, PostgreSQL (skipped without NOUS_SESSION_TEST_POSTGRES). The
renewals of worker A's run ``a`` are made to find another holder's lease, to fail, to hang or to
fail once (a store whose ``lease`` does so for that run's holder); or worker A's event loop is
blocked past the ttl while worker B, on an event loop of its own (a thread), takes the thread
and starts run ``b``. Run ``a``'s agent is cancelled and its end recorded as ``RUN_ERROR``;
run ``b`` goes on and finishes; nothing of ``a``'s agent comes after its end."""

from __future__ import annotations

import contextlib
import threading
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path
from typing import Any

import anyio
import httpx
import pytest
from ag_ui.core import RunAgentInput

from nous_session import Message, SessionActor
from nous_session.errors import StoreError
from nous_session.stores.base import Store
from nous_session.stores.memory import MemoryStore
from nous_session.stores.sqlite import SQLiteStore
from nous_session.web import SessionStreams
from nous_session.web._agui import RUN_ERROR, RUN_FINISHED, RUN_STARTED
from nous_session.web._run_host import ORPHANED
from nous_session.web._runs import CLAIM_TAKEN, CLAIM_UNCONFIRMED, LEASE_NAME
from tests.support.processes import shared_store_url
from tests.web.test_agui_streams import BASE, parse, run_input, types

pytestmark = pytest.mark.anyio

# Every wait is bounded by this (a loaded 2-core host is slow, never this slow).
WAIT = 30.0
# Short, so that a claim lapses soon: renewed every third of a second.
TTL = 1.0
HI = {"id": "u1", "role": "user", "content": "hi"}
NEXT = {"id": "u2", "role": "user", "content": "next"}


class Gated:
    """A store mixin: the renewals of run ``a``'s lease (every lease call of its holder but
    the first, the take) do what ``gate.mode`` says:

    * ``"pass"``: as the store does;
    * ``"taken"``: another holder has the lease by then (as when it lapsed and another run
      took it), so the renewal finds it;
    * ``"error"``: each fails with StoreError; ``"error once"``: the first does;
    * ``"hang"``: each waits, shielded (as a store's thread goes on: the run cannot cancel
      it), until ``gate.opened``.

    ``gate.releases`` counts that holder's releases.
    """

    gate: Gate

    async def lease(self, session_id: str, name: str, *, holder: str, ttl: float) -> bool:
        take = super().lease  # the store's, after this mixin
        gate = self.gate
        if name != LEASE_NAME or not holder.endswith(":a"):
            return await take(session_id, name, holder=holder, ttl=ttl)
        gate.calls += 1
        if gate.calls > 1:
            if gate.mode == "taken":
                await super().release(session_id, name, holder=holder)
                assert await take(session_id, name, holder="elsewhere:x", ttl=60)
            elif gate.mode == "error" or (gate.mode == "error once" and gate.calls == 2):
                raise StoreError("the test's store fails this renewal")
            elif gate.mode == "hang":
                with anyio.CancelScope(shield=True):
                    await gate.opened.wait()
        held: bool = await take(session_id, name, holder=holder, ttl=ttl)
        if gate.mode == "error once" and gate.calls > 2 and held:
            gate.recovered.set()
        return held

    async def release(self, session_id: str, name: str, *, holder: str) -> None:
        if name == LEASE_NAME and holder.endswith(":a"):
            self.gate.releases += 1
        await super().release(session_id, name, holder=holder)


class Gate:
    """What :class:`Gated` does with run ``a``'s renewals, and what it saw."""

    def __init__(self, mode: str = "pass") -> None:
        self.mode = mode
        self.calls = 0
        self.releases = 0
        self.opened = anyio.Event()  # ends the renewals that hang
        self.recovered = anyio.Event()  # a renewal held after the one that failed


class GatedMemory(Gated, MemoryStore):
    pass


class GatedSQLite(Gated, SQLiteStore):
    pass


@pytest.fixture(params=["memory", "sqlite", "postgres"])
def place(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    """Where the workers' store is: ``memory``, a SQLite file's URL, or a PostgreSQL URL with
    a schema of its own (dropped afterwards)."""
    if request.param == "memory":
        yield "memory"
        return
    yield from shared_store_url(request.param, tmp_path, "shared")


def store_at(place: str, gate: Gate | None = None) -> Store:
    """A new store on a SQLite file or PostgreSQL ``place``, gated when ``gate`` is given."""
    store: Any
    if place.startswith("sqlite:///"):
        path = place.removeprefix("sqlite:///")
        store = SQLiteStore(path) if gate is None else GatedSQLite(path)
    else:
        from nous_session.stores.postgres import PostgresStore

        class GatedPostgres(Gated, PostgresStore):
            pass

        store = PostgresStore(place) if gate is None else GatedPostgres(place)
    if gate is not None:
        store.gate = gate
    return store


@contextlib.asynccontextmanager
async def two_stores(place: str, gate: Gate) -> AsyncIterator[tuple[Store, Store]]:
    """Worker A's store (gated) and worker B's, on ``place`` (one object for memory)."""
    if place == "memory":
        shared = GatedMemory()
        shared.gate = gate
        async with shared:
            yield shared, shared
        return
    async with store_at(place, gate) as first, store_at(place) as second:
        yield first, second


@contextlib.asynccontextmanager
async def serving(store: Store, agent: Any) -> AsyncIterator[httpx.AsyncClient]:
    """A worker: ``SessionStreams`` on ``store`` (a claim lasting ``TTL``), and its client."""
    streams = SessionStreams(store, agent, run_lease_ttl=TTL)
    async with streams.lifespan():
        transport = httpx.ASGITransport(app=streams.app)
        async with httpx.AsyncClient(transport=transport, base_url=BASE, timeout=WAIT) as client:
            yield client


async def stored(store: Store) -> list[tuple[str, object]]:
    """Thread ``t1`` as the store holds it: each event's type, and its text or run id (a run's
    end: its run id and message)."""
    async with SessionActor.open(session_id="t1", store=store, follow=False) as session:
        found: list[tuple[str, object]] = []
        for event in session.log.events():
            data = event.data
            if event.type == RUN_ERROR:
                found.append((RUN_ERROR, (data["run_id"], data["message"])))
            else:
                found.append((str(event.type), data.get("content") or data.get("run_id")))
        return found


class Held:
    """The agent: run ``a`` says it works (then ``stall()`` blocks the loop, when set), then
    waits to be let ``go`` (noting that it was cancelled instead); another run says it is
    done."""

    def __init__(self) -> None:
        self.working = anyio.Event()
        self.go = anyio.Event()
        self.cancelled = anyio.Event()
        self.stall: Callable[[], None] | None = None  # called once ``a`` works, if set

    async def __call__(self, session: SessionActor, run: RunAgentInput) -> None:
        if run.run_id != "a":
            await session.add_message(Message.assistant(f"{run.run_id} done"))
            return
        await session.add_message(Message.assistant("a working"))
        self.working.set()
        if self.stall is not None:
            self.stall()  # blocks the whole event loop, as a stalled worker's stands still
        try:
            await self.go.wait()
        except anyio.get_cancelled_exc_class():
            self.cancelled.set()
            raise
        await session.add_message(Message.assistant("a late"))


def last_event(response: httpx.Response) -> dict[str, Any]:
    return parse(response.content)[-1][1]


async def test_a_run_whose_renewal_finds_another_holders_lease_stops_and_says_why(
    place: str,
) -> None:
    gate, agent = Gate("taken"), Held()
    async with two_stores(place, gate) as (store, _), serving(store, agent) as client:
        with anyio.fail_after(WAIT):
            # Answered once the run has ended: its first renewal found the other holder.
            response = await client.post("/run", json=run_input("t1", "a", [HI]))
        assert agent.cancelled.is_set()
        agent.go.set()
        assert last_event(response) == {"type": "RUN_ERROR", "message": CLAIM_TAKEN}
        assert await stored(store) == [
            ("user_message", "hi"),
            (RUN_STARTED, "a"),
            ("assistant_message", "a working"),
            (RUN_ERROR, ("a", CLAIM_TAKEN)),
        ]
        # The lease is not the run's any more: it is left to its holder.
        assert gate.releases == 0
        assert not await store.lease("t1", LEASE_NAME, holder="third:x", ttl=TTL)


@pytest.mark.parametrize("failure", ["error", "hang"])
async def test_a_run_whose_renewals_fail_or_hang_stops_when_its_claim_may_lapse(
    place: str, failure: str
) -> None:
    """No renewal confirms the claim: the run stops when it may lapse (not before), and the
    other worker's run starts once it has."""
    gate, agent = Gate(failure), Held()
    async with (
        two_stores(place, gate) as (first_store, second_store),
        serving(first_store, agent) as first,
        serving(second_store, agent) as second,
    ):
        try:
            with anyio.fail_after(WAIT):
                began = anyio.current_time()
                response = await first.post("/run", json=run_input("t1", "a", [HI]))
                lasted = anyio.current_time() - began
                assert agent.cancelled.is_set()
                body = run_input("t1", "b", [HI, NEXT])
                # Refused until the claim has lapsed in the store too.
                while (answer := await second.post("/run", json=body)).status_code == 409:  # noqa: ASYNC110
                    await anyio.sleep(0.05)  # polled: a lease lapses without a signal
            # A stopped without giving up a lease it could not tell it held. (A renewal that
            # hung re-takes the lease once it answers, the thread being free: A gives it up.)
            assert gate.releases == 0
        finally:
            gate.opened.set()
        agent.go.set()
        assert lasted >= TTL, lasted  # the claim held until then: the run went on
        assert last_event(response) == {"type": "RUN_ERROR", "message": CLAIM_UNCONFIRMED}
        assert types(parse(answer.content))[-1] == "RUN_FINISHED"
        assert await stored(first_store) == [
            ("user_message", "hi"),
            (RUN_STARTED, "a"),
            ("assistant_message", "a working"),
            (RUN_ERROR, ("a", CLAIM_UNCONFIRMED)),
            ("user_message", "next"),
            (RUN_STARTED, "b"),
            ("assistant_message", "b done"),
            (RUN_FINISHED, "b"),
        ]


async def test_a_renewal_that_fails_once_does_not_stop_the_run(place: str) -> None:
    gate = Gate("error once")

    async def agent(session: SessionActor, run: RunAgentInput) -> None:
        await session.add_message(Message.assistant("a working"))
        await gate.recovered.wait()  # a renewal failed, the next one held
        await session.add_message(Message.assistant("a done"))

    async with two_stores(place, gate) as (store, _), serving(store, agent) as client:
        with anyio.fail_after(WAIT):
            response = await client.post("/run", json=run_input("t1", "a", [HI]))
        assert types(parse(response.content))[-1] == "RUN_FINISHED"
        assert [kind for kind, _ in await stored(store)][-2:] == ["assistant_message", RUN_FINISHED]
        assert gate.releases == 1  # it held the thread to the end, and gave it up


class Other:
    """Worker B, on an event loop of its own in a thread (worker A's is blocked meanwhile):
    once A's run works (``asked``), it asks for run ``b`` until it starts it (refused while
    A's claim lasts). Run ``b`` says it works (``started``), waits to be let ``go``, and says
    it is done. The events are threading ones: the two loops share no anyio event."""

    def __init__(self, place: str, backend: tuple[str, dict[str, Any]]) -> None:
        self.asked = threading.Event()
        self.started = threading.Event()
        self.go = threading.Event()
        self.response: httpx.Response | None = None
        self.error: BaseException | None = None
        self._thread = threading.Thread(target=self._serve, args=(place, *backend))

    async def __call__(self, session: SessionActor, run: RunAgentInput) -> None:
        await session.add_message(Message.assistant("b working"))
        self.started.set()
        await anyio.to_thread.run_sync(self.go.wait, WAIT)
        await session.add_message(Message.assistant("b done"))

    def _serve(self, place: str, backend: str, options: dict[str, Any]) -> None:
        try:
            anyio.run(self._take_over, place, backend=backend, backend_options=options)
        except BaseException as error:  # told to the test, in its thread
            self.error = error
            self.started.set()  # a stalled worker A waits no longer

    async def _take_over(self, place: str) -> None:
        async with store_at(place) as store, serving(store, self) as client:
            with anyio.fail_after(WAIT):
                await anyio.to_thread.run_sync(self.asked.wait, WAIT)
                body = run_input("t1", "b", [HI, NEXT])
                while (response := await client.post("/run", json=body)).status_code == 409:  # noqa: ASYNC110
                    await anyio.sleep(0.05)  # polled: a lease lapses without a signal
            self.response = response

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        """Let B go on to its end (whatever happened to A), and wait for it."""
        self.asked.set()
        self.go.set()
        self._thread.join(WAIT)

    def join(self) -> httpx.Response:
        """Run ``b``'s response, once B has stopped (its run ended)."""
        self._thread.join(WAIT)
        if self.error is not None:
            raise self.error
        assert self.response is not None, "worker B never stopped"
        return self.response


@pytest.mark.parametrize("place", ["sqlite", "postgres"], indirect=True)
@pytest.mark.parametrize("other_run", ["going on", "over"])
async def test_a_worker_blocked_past_the_ttl_stops_its_run_when_it_resumes(
    place: str, other_run: str, anyio_backend: tuple[str, dict[str, Any]]
) -> None:
    """Worker A's event loop is blocked (CPU-bound code, a long GC pause) while its claim
    lapses and worker B takes the thread and starts run ``b`` (still going on, or over by
    the time A resumes). Once A resumes, its run stops: its agent is cancelled, and its end
    is the one B recorded when it took the thread. Run ``b`` finishes as it would have."""
    agent, other = Held(), Other(place, anyio_backend)

    def stall() -> None:
        """Block this loop until B has started run ``b`` (or until it is over)."""
        other.asked.set()
        other.started.wait(WAIT)
        if other_run == "over":
            other.go.set()
            other.join()

    agent.stall = stall
    other.start()
    try:
        async with store_at(place) as store, serving(store, agent) as first:
            with anyio.fail_after(WAIT):
                response = await first.post("/run", json=run_input("t1", "a", [HI]))
                await agent.cancelled.wait()  # A learned that it lost the thread
            agent.go.set()
            other.go.set()
            finished = await anyio.to_thread.run_sync(other.join)
            assert types(parse(finished.content))[-1] == "RUN_FINISHED"
            assert last_event(response) == {"type": "RUN_ERROR", "message": ORPHANED}
            # The thread is free again: no stale claim is left (A's run gave up the lease it
            # had re-taken, when it had).
            with anyio.fail_after(WAIT):
                after = await first.post("/run", json=run_input("t1", "c", []))
            assert types(parse(after.content))[-1] == "RUN_FINISHED", after.text
            assert await stored(store) == [
                ("user_message", "hi"),
                (RUN_STARTED, "a"),
                ("assistant_message", "a working"),
                (RUN_ERROR, ("a", ORPHANED)),
                ("user_message", "next"),
                (RUN_STARTED, "b"),
                ("assistant_message", "b working"),
                ("assistant_message", "b done"),
                (RUN_FINISHED, "b"),
                (RUN_STARTED, "c"),
                ("assistant_message", "c done"),
                (RUN_FINISHED, "c"),
            ]
    finally:
        await anyio.to_thread.run_sync(other.stop)
