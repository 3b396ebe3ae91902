"""Google ADK: the outcome rules at each commit of a multi-commit call, with the store's
failures injected (a commit refused: StoreError; a commit that lands and whose reply is lost:
OutcomeUnknownError), compared with what ADK's own InMemorySessionService ends with.

ADK is asyncio-only, so these tests pin asyncio (see test_google_adk.py).
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Coroutine
from typing import Any

import anyio
import anyio.to_thread
import pytest
from google.adk.errors.already_exists_error import AlreadyExistsError
from google.adk.events.event import Event
from google.adk.events.event_actions import EventActions
from google.adk.sessions import InMemorySessionService
from google.genai import types

from nous_session.errors import OutcomeUnknownError, StoreError
from nous_session.integrations.google_adk import NousSessionService
from nous_session.stores import MemoryStore
from tests.integrations.test_google_adk import APP, USER, FailingStore
from tests.integrations.test_langgraph_outcomes import FailingStore as TypedFailingStore

pytestmark = pytest.mark.anyio

STATE: dict[str, Any] = {"app:plan": "pro", "user:lang": "en", "topic": "weather"}
# A session's state, another user's new session's (the app's state) and the user's state.
States = tuple[dict[str, Any], dict[str, Any], dict[str, Any]]


@pytest.fixture
def anyio_backend() -> str:
    """ADK runs on asyncio only."""
    return "asyncio"


async def _adk_own(state: dict[str, Any]) -> States:
    """What ADK's own service holds after creating s1 with ``state`` and s2 bare: s1's state,
    s2's (the app's state) and the user's."""
    own = InMemorySessionService()
    await own.create_session(app_name=APP, user_id=USER, session_id="s1", state=dict(state))
    other = await own.create_session(app_name=APP, user_id="u2", session_id="s2")
    read = await own.get_session(app_name=APP, user_id=USER, session_id="s1")
    assert read is not None
    user = await own.get_user_state(app_name=APP, user_id=USER)
    return read.state, other.state, user


async def _ours(service: NousSessionService) -> States:
    read = await service.get_session(app_name=APP, user_id=USER, session_id="s1")
    assert read is not None
    other = await service.create_session(app_name=APP, user_id="u2", session_id="s2")
    user = await service.get_user_state(app_name=APP, user_id=USER)
    return read.state, other.state, user


@pytest.mark.parametrize("failing", ["adk:a/", "adk:u/"], ids=["app-state", "user-state"])
async def test_a_create_whose_initial_state_failed_is_finished_by_creating_it_again(
    failing: str,
) -> None:
    """The session's creation commits first, its app and user initial state after it, in
    their sessions. When those fail, the call raised StoreError though the session was
    created, and creating it again raised AlreadyExistsError with the state never applied.
    Now: OutcomeUnknownError, and creating it again applies what is missing (once), then
    says it exists."""
    store = FailingStore()
    async with NousSessionService(store) as service:
        store.fail = failing
        with pytest.raises(OutcomeUnknownError, match="create it again"):
            await service.create_session(
                app_name=APP, user_id=USER, session_id="s1", state=dict(STATE)
            )
        store.fail = None
        for _ in range(2):  # again, twice: applied once
            with pytest.raises(AlreadyExistsError):
                await service.create_session(
                    app_name=APP, user_id=USER, session_id="s1", state=dict(STATE)
                )
        assert await _ours(service) == await _adk_own(STATE)


async def test_a_create_whose_reply_was_lost_is_finished_by_creating_it_again() -> None:
    """The creation's commit landed but its reply was lost (OutcomeUnknownError before its
    app and user state were applied): creating it again applies them, once."""
    store = FailingStore()
    async with NousSessionService(store) as service:
        store.lose = "adk:s/"
        with pytest.raises(OutcomeUnknownError):
            await service.create_session(
                app_name=APP, user_id=USER, session_id="s1", state=dict(STATE)
            )
        with pytest.raises(AlreadyExistsError):
            await service.create_session(app_name=APP, user_id=USER, session_id="s1")
        assert await _ours(service) == await _adk_own(STATE)


async def test_a_create_refused_by_the_store_creates_nothing() -> None:
    store = FailingStore()
    async with NousSessionService(store) as service:
        store.fail = "adk:s/"
        with pytest.raises(StoreError):
            await service.create_session(
                app_name=APP, user_id=USER, session_id="s1", state=dict(STATE)
            )
        store.fail = None
        assert await service.get_session(app_name=APP, user_id=USER, session_id="s1") is None
        assert await service.get_user_state(app_name=APP, user_id=USER) == {}
        await service.create_session(app_name=APP, user_id=USER, session_id="s1", state=dict(STATE))
        assert await _ours(service) == await _adk_own(STATE)


@pytest.mark.parametrize("losing", ["adk:a/", "adk:u/"], ids=["app-state", "user-state"])
async def test_an_event_whose_state_reply_was_lost_is_finished_once(losing: str) -> None:
    """An app or user delta that landed with its reply lost: OutcomeUnknownError, and the
    same event again applies each delta once (ADK's own service applies each once)."""
    store = FailingStore()
    delta = {"app:calls": 1, "user:seen": 2, "temp:scratch": 3, "n": 4}
    event = Event(author="user", actions=EventActions(state_delta=dict(delta)))
    async with NousSessionService(store) as service:
        session = await service.create_session(app_name=APP, user_id=USER, session_id="s1")
        store.lose = losing
        with pytest.raises(OutcomeUnknownError):
            await service.append_event(session, event)
        again = event.model_copy(deep=True)
        again.actions.state_delta = dict(delta)  # as delivered the first time, temp: and all
        await service.append_event(session, again)
        ours = await _ours(service)
    own = InMemorySessionService()
    theirs = await own.create_session(app_name=APP, user_id=USER, session_id="s1")
    await own.append_event(theirs, Event(author="user", actions=EventActions(state_delta=delta)))
    assert session.state == theirs.state
    other = await own.create_session(app_name=APP, user_id="u2", session_id="s2")
    read = await own.get_session(app_name=APP, user_id=USER, session_id="s1")
    assert read is not None
    assert ours == (read.state, other.state, await own.get_user_state(app_name=APP, user_id=USER))


@pytest.mark.parametrize("lose", [False, True], ids=["refused", "reply-lost"])
async def test_a_delete_whose_surface_remove_fails_deletes_and_returns(lose: bool) -> None:
    """The deletion committed, then the remove of the surface (a view) failed: the call
    raised that StoreError, which says nothing was deleted."""
    store = TypedFailingStore()
    async with NousSessionService(store) as service:
        session = await service.create_session(app_name=APP, user_id=USER, session_id="s1")
        content = types.Content(role="user", parts=[types.Part(text="hi")])
        await service.append_event(session, Event(author="user", content=content))
        store.fail, store.lose = "remove", lose
        await service.delete_session(app_name=APP, user_id=USER, session_id="s1")
        assert await service.get_session(app_name=APP, user_id=USER, session_id="s1") is None


class HeldStore(MemoryStore):
    """A memory store whose commits to the sessions starting with ``hold`` wait (in the
    portal's thread's loop, without blocking it) until ``go`` is set; ``held`` is set once
    one waits. ``user_state`` is set once a commit to a user's state session lands (the
    last of a call's commits, which the portal finishes after its caller was cancelled)."""

    hold: str | None = None

    def __init__(self) -> None:
        super().__init__()
        self.held = threading.Event()
        self.go = threading.Event()
        self.user_state = threading.Event()

    async def commit_rebased(self, session_id: str, **arguments: Any) -> Any:
        await self._wait(session_id)
        rebased = await super().commit_rebased(session_id, **arguments)
        self._landed(session_id)
        return rebased

    async def commit(self, session_id: str, **arguments: Any) -> str | None:
        await self._wait(session_id)
        uid = await super().commit(session_id, **arguments)
        self._landed(session_id)
        return uid

    def _landed(self, session_id: str) -> None:
        if session_id.startswith("adk:u/"):
            self.user_state.set()

    async def cancel_while_held(self, call: Coroutine[Any, Any, Any]) -> None:
        """Run ``call`` until its commit to a session of ADK's waits, cancel its caller there,
        let the commit go, check the caller raised the cancellation, and wait until the
        portal has finished the call (its last commit, the user's state, has landed)."""
        self.hold = "adk:s/"
        task = asyncio.ensure_future(call)
        await anyio.to_thread.run_sync(self.held.wait)
        task.cancel()
        self.hold = None
        self.go.set()
        with pytest.raises(asyncio.CancelledError):
            await task
        assert await anyio.to_thread.run_sync(self.user_state.wait, 30), "it never landed"

    async def _wait(self, session_id: str) -> None:
        if self.hold is not None and session_id.startswith(self.hold):
            self.held.set()
            await anyio.to_thread.run_sync(self.go.wait)


async def test_a_cancelled_append_completes_its_state_deltas() -> None:
    """A caller cancelled while its event's commit is in flight: the portal commits the
    event whatever happens to the caller, and its app and user deltas with it (ADK's own
    services store the event and its state in one step); the call raises the cancellation."""
    store = HeldStore()
    delta = {"app:calls": 1, "user:seen": 2, "n": 3}
    async with NousSessionService(store) as service:
        session = await service.create_session(app_name=APP, user_id=USER, session_id="s1")
        event = Event(author="user", actions=EventActions(state_delta=dict(delta)))
        await store.cancel_while_held(service.append_event(session, event))
        ours = await _ours(service)
    own = InMemorySessionService()
    theirs = await own.create_session(app_name=APP, user_id=USER, session_id="s1")
    await own.append_event(theirs, Event(author="user", actions=EventActions(state_delta=delta)))
    other = await own.create_session(app_name=APP, user_id="u2", session_id="s2")
    read = await own.get_session(app_name=APP, user_id=USER, session_id="s1")
    assert read is not None
    assert ours == (read.state, other.state, await own.get_user_state(app_name=APP, user_id=USER))


async def test_a_cancelled_create_completes_its_initial_state() -> None:
    """As for an append: a caller cancelled while the creation's commit is in flight leaves
    the session created with its app and user initial state."""
    store = HeldStore()
    async with NousSessionService(store) as service:
        await store.cancel_while_held(
            service.create_session(app_name=APP, user_id=USER, session_id="s1", state=STATE)
        )
        assert await _ours(service) == await _adk_own(STATE)
