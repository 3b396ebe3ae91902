"""Sessions and SessionsPortal against a plain model, under random concurrent use.

A hypothesis state machine drives a registry with a tiny ``max_open`` and ``idle_timeout``
through random steps: batches of concurrent requests (get, use, read; for the portal, calls
from several threads with sync and async functions), holding a session across steps, letting
time pass so the reaper closes idle actors, and closing the registry while requests are in
flight. The model is a dict of session id -> the message texts whose append was acknowledged.
After every step it checks that:

* every acknowledged append is stored (read from the store itself), no refused one is, none
  twice, and one caller's appends are stored in the order it made them;
* no actor held by a ``use`` block (or a portal call) closed under it, and ``get`` returned
  only open actors;
* closing the registry, with requests in flight, ended within a bound;
* the registry's counters agree with a scan of its entries, and it is above ``max_open`` only
  by what is held (plus the one actor a ``get`` just handed out).

Each machine runs ``max_examples`` x ``stateful_step_count`` steps (see ``SETTINGS``): few in
the ``dev`` profile, more under ``HYPOTHESIS_PROFILE=ci``.
"""

from __future__ import annotations

import asyncio
import itertools
import os
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from concurrent.futures import TimeoutError as FutureTimeoutError
from contextlib import AbstractContextManager
from typing import Any

import anyio
import anyio.from_thread
import anyio.lowlevel
import attrs
import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    invariant,
    precondition,
    rule,
    run_state_machine_as_test,
)

from nous_session import Message, SessionActor, SessionClosedError
from nous_session.log import Log
from nous_session.registry import Sessions, SessionsPortal
from nous_session.stores.memory import MemoryStore
from tests.support.tallies import Tallies

SESSION_IDS = ("a", "b", "c", "d")
MAX_OPEN = 2
IDLE_TIMEOUT = 0.02  # seconds: small, so that the idle rule sees the reaper close actors
CLOSE_BOUND = 10.0  # seconds within which closing, with requests in flight, must end
CI = os.environ.get("HYPOTHESIS_PROFILE") == "ci"
SETTINGS = settings(
    max_examples=15 if CI else 6,
    stateful_step_count=20 if CI else 15,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)

session_ids = st.sampled_from(SESSION_IDS)
checkpoints = st.integers(0, 3)


class _Model:
    """What the registry must have stored: acknowledged, refused and sent texts per session.

    Appended to from the event loop's thread and, for the portal, from the portal's thread;
    a lock keeps the few compound updates whole.
    """

    def __init__(self) -> None:
        self.acked: dict[str, list[str]] = {sid: [] for sid in SESSION_IDS}
        self.refused: set[str] = set()
        self.sent: set[str] = set()
        self.ordered: list[tuple[str, str, str]] = []  # (sid, earlier, later) of one caller
        self.violations: list[str] = []
        self._texts = itertools.count()
        self._lock = threading.Lock()

    def text(self) -> str:
        with self._lock:
            text = f"t{next(self._texts)}"
            self.sent.add(text)
            return text

    def acknowledged(self, session_id: str, text: str) -> None:
        with self._lock:
            self.acked[session_id].append(text)

    def violation(self, what: str) -> None:
        with self._lock:
            self.violations.append(what)

    def check(self, read: Callable[[str], list[str]]) -> None:
        assert not self.violations, self.violations
        for sid in SESSION_IDS:
            stored = read(sid)
            assert len(stored) == len(set(stored)), f"{sid}: stored twice: {stored}"
            assert set(self.acked[sid]) <= set(stored), f"{sid}: acknowledged, lost: {stored}"
            assert set(stored) <= self.sent, f"{sid}: stored, never sent: {stored}"
            assert not set(stored) & self.refused, f"{sid}: refused, stored: {stored}"
        for sid, earlier, later in self.ordered:
            stored = read(sid)
            assert stored.index(earlier) < stored.index(later), (sid, earlier, later, stored)


def _texts(events: Any) -> list[str]:
    return [message.text for message in Log.restore(events).derive_messages()]


async def _add(
    model: _Model, actor: SessionActor, *, held: bool, closing: Callable[[], bool]
) -> str | None:
    """Append a fresh text; record the outcome. A held actor may refuse only while closing."""
    text = model.text()
    try:
        await actor.add_message(Message.user(text))
    except SessionClosedError:
        model.refused.add(text)
        if held and not closing():
            model.violation(f"{text}: a held actor of {actor.session_id!r} refused it")
        return None
    model.acknowledged(actor.session_id, text)
    return text


@attrs.define
class _Holder:
    """A ``use`` block held open across steps, in a task of its own."""

    session_id: str
    actor: SessionActor
    release: anyio.Event
    done: Future[None]


class RegistryMachine(RuleBasedStateMachine):
    """A :class:`Sessions` registry on an event loop kept in a thread for the machine's life."""

    backend = "asyncio"

    def __init__(self) -> None:
        super().__init__()
        self.model = _Model()
        self.store = MemoryStore()
        self.holders: list[_Holder] = []
        self.closing = False
        self._loop_cm: AbstractContextManager[anyio.from_thread.BlockingPortal] = (
            anyio.from_thread.start_blocking_portal(self.backend)
        )
        self.loop = self._loop_cm.__enter__()
        self._start_registry()

    # The registry's life: entered and left in one task of its own ----------------------------

    def _start_registry(self) -> None:
        self.closing = False
        self.stop, self.ended = self.loop.call(_events, 2)
        self.life, self.sessions = self.loop.start_task(self._life)

    async def _life(self, *, task_status: anyio.abc.TaskStatus[Sessions]) -> None:
        try:
            async with Sessions(
                self.store, max_open=MAX_OPEN, idle_timeout=IDLE_TIMEOUT
            ) as sessions:
                task_status.started(sessions)
                await self.stop.wait()
        finally:
            self.ended.set()

    async def _close_registry(self) -> None:
        self.closing = True
        self.stop.set()
        await self.ended.wait()

    def _release_holders(self) -> None:
        for holder in self.holders:
            self.loop.call(_set, holder.release)
        for holder in self.holders:
            holder.done.result(timeout=CLOSE_BOUND)
        self.holders.clear()

    def teardown(self) -> None:
        try:
            if not self.ended.is_set():
                self.loop.call(_bounded, self._close_registry)
            self._release_holders()
        finally:
            # Whatever a failed run left behind is cancelled, not waited for.
            self.loop.call(self.loop.stop, True)
            self._loop_cm.__exit__(None, None, None)

    # Requests -------------------------------------------------------------------------------

    async def _request(self, kind: str, session_id: str, pauses: int) -> None:
        sessions, model = self.sessions, self.model

        def closing() -> bool:
            return self.closing

        try:
            if kind == "use":
                async with sessions.use(session_id) as actor:
                    if actor.closed:
                        model.violation(f"use({session_id!r}) gave a closed actor")
                    first = await _add(model, actor, held=True, closing=closing)
                    await _pause(pauses)
                    second = await _add(model, actor, held=True, closing=closing)
                    if first and second:
                        model.ordered.append((session_id, first, second))
                    if actor.closed and not self.closing:
                        model.violation(f"the held actor of {session_id!r} closed")
                return
            before = list(model.acked[session_id])
            actor = await sessions.get(session_id)
            # Where get() returns, before anything else runs: the actor must be open.
            if actor.closed or (session_id not in sessions and not self.closing):
                model.violation(f"get({session_id!r}) returned a closed actor")
            if kind == "read":
                seen = [message.text for message in actor.messages()]
                if not set(before) <= set(seen):
                    model.violation(f"get({session_id!r}) missed {before} in {seen}")
            elif kind == "get":
                # Nothing ran since get() returned, so the actor still takes the request.
                await _add(model, actor, held=True, closing=closing)
            else:  # "get, later": no lease after get() returns, so it may be closed by now
                await _pause(pauses)
                await _add(model, actor, held=False, closing=closing)
        except SessionClosedError:
            if not self.closing:
                model.violation(f"{kind}({session_id!r}) refused with the registry open")

    async def _batch(self, requests: list[tuple[str, str, int]], close_after: int | None) -> None:
        async with anyio.create_task_group() as task_group:
            for request in requests:
                task_group.start_soon(self._request, *request)
            if close_after is not None:
                await _pause(close_after)
                await self._close_registry()

    requests = st.lists(
        st.tuples(st.sampled_from(["get", "get, later", "use", "read"]), session_ids, checkpoints),
        min_size=1,
        max_size=6,
    )

    @rule(batch=requests)
    def concurrent_requests(self, batch: list[tuple[str, str, int]]) -> None:
        self.loop.call(_bounded, self._batch, batch, None)

    @precondition(lambda self: len(self.holders) < 3)
    @rule(session_id=session_ids)
    def hold(self, session_id: str) -> None:
        release = self.loop.call(_events, 1)[0]
        done, actor = self.loop.start_task(self._hold, session_id, release)
        self.holders.append(_Holder(session_id, actor, release, done))

    async def _hold(
        self,
        session_id: str,
        release: anyio.Event,
        *,
        task_status: anyio.abc.TaskStatus[SessionActor],
    ) -> None:
        async with self.sessions.use(session_id) as actor:
            task_status.started(actor)
            await release.wait()
            await _add(self.model, actor, held=True, closing=lambda: self.closing)

    @precondition(lambda self: bool(self.holders))
    @rule(data=st.data())
    def release(self, data: st.DataObject) -> None:
        holder = self.holders.pop(data.draw(st.integers(0, len(self.holders) - 1)))
        self.loop.call(_set, holder.release)
        holder.done.result(timeout=CLOSE_BOUND)

    @rule()
    def idle(self) -> None:
        # Time passing is the step itself: long enough for the reaper to close idle actors.
        time.sleep(IDLE_TIMEOUT * 2.5)

    @rule(batch=requests, close_after=st.integers(0, 4))
    def close_while_busy(self, batch: list[tuple[str, str, int]], close_after: int) -> None:
        self.loop.call(_bounded, self._batch, batch, close_after)
        self.life.result(timeout=CLOSE_BOUND)  # the registry's own task ended without error
        self._release_holders()
        self._start_registry()

    # Invariants -----------------------------------------------------------------------------

    @invariant()
    def everything_acknowledged_is_stored(self) -> None:
        STEPS["registry"] += 1  # invariants run after every step
        self.model.check(lambda sid: self.loop.call(_stored, self.store, sid))

    @invariant()
    def held_actors_are_open_and_counters_agree(self) -> None:
        self.loop.call(_check_registry, self.sessions, self.holders, self.closing)


class PortalMachine(RuleBasedStateMachine):
    """A :class:`SessionsPortal` called from a pool of real threads."""

    backend = "asyncio"
    threads = 4

    def __init__(self) -> None:
        super().__init__()
        self.model = _Model()
        self.store = MemoryStore()
        self.pool = ThreadPoolExecutor(self.threads)
        self.closing = False
        self.portal = self._portal()

    def _portal(self) -> SessionsPortal:
        self.closing = False
        return SessionsPortal(
            self.store, backend=self.backend, max_open=MAX_OPEN, idle_timeout=IDLE_TIMEOUT
        )

    def teardown(self) -> None:
        try:
            self._close_portal()
        finally:
            self.pool.shutdown(wait=False, cancel_futures=True)

    def _close_portal(self) -> None:
        self.closing = True
        closed = self.pool.submit(self.portal.close)
        try:
            closed.result(timeout=CLOSE_BOUND)
        except FutureTimeoutError:
            raise AssertionError(f"closing the portal took over {CLOSE_BOUND} s") from None

    # Calls (each on a pool thread) ----------------------------------------------------------

    def _call(self, kind: str, session_id: str) -> None:
        portal, model = self.portal, self.model
        before = list(model.acked[session_id])

        def closing() -> bool:
            return self.closing

        def check(actor: SessionActor) -> None:
            # Runs on the portal's thread with the actor held for the call.
            if actor.closed:
                model.violation(f"{kind}({session_id!r}) ran with a closed actor")

        def read(actor: SessionActor) -> None:
            check(actor)
            seen = [message.text for message in actor.messages()]
            if not set(before) <= set(seen):
                model.violation(f"{kind}({session_id!r}) missed {before} in {seen}")

        async def add_twice(actor: SessionActor) -> None:
            check(actor)
            first = await _add(model, actor, held=True, closing=closing)
            await anyio.lowlevel.checkpoint()
            second = await _add(model, actor, held=True, closing=closing)
            if first and second:
                model.ordered.append((session_id, first, second))

        def add_once(actor: SessionActor) -> Any:
            check(actor)
            return _add(model, actor, held=True, closing=closing)  # awaited by the portal

        try:
            if kind == "call, async":
                portal.call(session_id, add_twice)
            elif kind == "call, sync":
                portal.call(session_id, add_once)
            elif kind == "call, read":
                portal.call(session_id, read)
            elif kind == "start":
                portal.start(session_id, add_twice).result(timeout=CLOSE_BOUND)
            else:  # "acall": from a fresh event loop in this thread
                asyncio.run(portal.acall(session_id, add_once))
        except SessionClosedError:
            if not self.closing:
                model.violation(f"{kind}({session_id!r}) refused with the portal open")

    def _run(self, calls: list[tuple[str, str]], close_after: float | None) -> None:
        futures = [self.pool.submit(self._call, *call) for call in calls]
        if close_after is not None:
            time.sleep(close_after)  # let some calls start, then close under the others
            self._close_portal()
        for future in futures:
            try:
                future.result(timeout=CLOSE_BOUND)
            except FutureTimeoutError:
                raise AssertionError(f"a call did not end within {CLOSE_BOUND} s") from None

    calls = st.lists(
        st.tuples(
            st.sampled_from(["call, async", "call, sync", "call, read", "start", "acall"]),
            session_ids,
        ),
        min_size=1,
        max_size=8,
    )

    @rule(batch=calls)
    def concurrent_calls(self, batch: list[tuple[str, str]]) -> None:
        self._run(batch, None)

    @rule()
    def idle(self) -> None:
        time.sleep(IDLE_TIMEOUT * 2.5)  # time passing is the step: the reaper closes actors

    @rule(batch=calls, close_after=st.sampled_from([0.0, 0.0005, 0.002]))
    def close_while_busy(self, batch: list[tuple[str, str]], close_after: float) -> None:
        self._run(batch, close_after)
        with pytest.raises(SessionClosedError):
            self.portal.call("a", lambda actor: None)
        self.portal = self._portal()

    @invariant()
    def everything_acknowledged_is_stored(self) -> None:
        STEPS["portal"] += 1  # invariants run after every step
        # Read on a loop of its own: the MemoryStore is plain data, and no call is in flight.
        self.model.check(lambda sid: anyio.run(_stored, self.store, sid))


def _check_registry(sessions: Sessions, holders: list[_Holder], closing: bool) -> None:
    """The registry's O(1) counters against a scan of its entries (test-only knowledge of its
    internals), and the rules about leases and ``max_open``."""
    if closing:
        return
    for holder in holders:
        assert not holder.actor.closed, f"the held actor of {holder.session_id!r} closed"
        assert holder.session_id in sessions
    entries = list(sessions._table.by_id.values())
    running = [e for e in entries if e.actor is not None and not e.closing]
    leased = [e for e in running if e.leases]
    stats = sessions.statistics()
    assert (stats.open, stats.leased) == (len(running), len(leased)), (stats, entries)
    assert {e.session_id for e in running if not e.leases} == set(sessions._table.idle)
    assert stats.open <= max(MAX_OPEN, stats.leased + 1), stats


async def _events(count: int) -> list[anyio.Event]:
    return [anyio.Event() for _ in range(count)]  # made on the loop they belong to


def _set(event: anyio.Event) -> None:
    event.set()


async def _stored(store: MemoryStore, session_id: str) -> list[str]:
    return _texts(await store.load(session_id))


async def _pause(checkpoints: int) -> None:
    for _ in range(checkpoints):
        await anyio.lowlevel.checkpoint()


async def _bounded(fn: Callable[..., Any], *args: Any) -> None:
    try:
        with anyio.fail_after(CLOSE_BOUND):
            await fn(*args)
    except TimeoutError:
        raise AssertionError(f"{fn.__name__} did not end within {CLOSE_BOUND} s") from None


STEPS = {"registry": 0, "portal": 0}


@pytest.fixture(autouse=True)
def _step_summary(tallies: Tallies) -> Iterator[None]:
    """Each test's steps, for the terminal summary's line."""
    before = dict(STEPS)
    yield
    tallies.add(
        f"registry model ({os.environ.get('HYPOTHESIS_PROFILE', 'dev')} profile):"
        " {registry} registry steps,"
        " {portal} portal steps",
        **{kind: STEPS[kind] - before[kind] for kind in STEPS},
    )


@pytest.mark.parametrize("backend", ["asyncio", "trio"])
def test_the_registry_agrees_with_the_model(backend: str) -> None:
    machine = type(f"RegistryMachine_{backend}", (RegistryMachine,), {"backend": backend})
    run_state_machine_as_test(machine, settings=SETTINGS)


@pytest.mark.parametrize("backend", ["asyncio", "trio"])
def test_the_portal_from_threads_agrees_with_the_model(backend: str) -> None:
    machine = type(f"PortalMachine_{backend}", (PortalMachine,), {"backend": backend})
    run_state_machine_as_test(machine, settings=SETTINGS)
