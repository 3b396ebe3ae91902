"""The Google ADK session service: a real ``Runner`` on ADK's offline model, reopening from a
SQLite file, stale writers, state deltas, compaction, deletion and ids.

ADK is asyncio-only (its runner, agents and session services use asyncio's own APIs:
``asyncio.create_task``, ``asyncio.Queue``, ``asyncio.run`` in ``Runner.run``), so these tests
pin asyncio instead of running on asyncio and trio as the rest of the suite does. The service
itself runs its actors on a portal loop of its own, whatever the caller's loop.
ADK's own contract tests run against it in ``.ci/google_adk``.
"""

from __future__ import annotations

import asyncio
import os
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anyio
import anyio.to_thread
import pytest

pytest.importorskip("google.adk")

from google.adk.agents import Agent
from google.adk.apps._configs import EventsCompactionConfig
from google.adk.apps.app import App
from google.adk.apps.llm_event_summarizer import LlmEventSummarizer
from google.adk.cli.agent_test_runner import MockModel
from google.adk.errors import StaleSessionError
from google.adk.errors.already_exists_error import AlreadyExistsError
from google.adk.errors.session_not_found_error import SessionNotFoundError
from google.adk.events.event import Event
from google.adk.events.event_actions import EventActions, EventCompaction
from google.adk.runners import Runner
from google.adk.sessions.base_session_service import GetSessionConfig
from google.genai import types

from nous_session import Role, SessionActor, SessionsPortal
from nous_session.errors import OutcomeUnknownError, StoreError
from nous_session.integrations import google_adk
from nous_session.integrations.google_adk import (
    CREATED_EVENT,
    DELETED_EVENT,
    EVENT_EVENT,
    NousSessionService,
)
from nous_session.stores import MemoryStore, open_store

pytestmark = pytest.mark.anyio

APP = "weather"
USER = "u1"
POSTGRES = os.environ.get("NOUS_SESSION_TEST_POSTGRES", "")


@pytest.fixture
def anyio_backend() -> str:
    """ADK runs on asyncio only (see the module's docstring)."""
    return "asyncio"


def get_weather(city: str) -> dict[str, Any]:
    """The weather in a city (the agent's tool)."""
    return {"city": city, "celsius": 18}


def _text(role: str, text: str) -> types.Content:
    return types.Content(role=role, parts=[types.Part(text=text)])


def _call(city: str) -> types.Content:
    call = types.FunctionCall(id="call-1", name="get_weather", args={"city": city})
    return types.Content(role="model", parts=[types.Part(function_call=call)])


def _runner(service: NousSessionService, model: MockModel) -> Runner:
    agent = Agent(name="assistant", model=model, tools=[get_weather])
    return Runner(app_name=APP, agent=agent, session_service=service)


async def _turn(runner: Runner, session_id: str, text: str) -> list[Event]:
    return [
        event
        async for event in runner.run_async(
            user_id=USER, session_id=session_id, new_message=_text("user", text)
        )
    ]


async def _surface(service: NousSessionService, session_id: str) -> list[Any]:
    async def read(actor: SessionActor) -> list[Any]:
        await actor.reload()
        return list(actor.messages())

    return await service.portal.acall(service.session_id(APP, USER, session_id), read)


async def _events(service: NousSessionService, session_id: str) -> list[Any]:
    async def read(actor: SessionActor) -> list[Any]:
        return list((await actor.reload()).events())

    return await service.portal.acall(service.session_id(APP, USER, session_id), read)


async def test_a_runner_turn_with_a_tool_call_is_kept_and_reopens_from_sqlite(
    tmp_path: Path,
) -> None:
    url = f"sqlite:///{tmp_path / 'adk.sqlite3'}"
    model = MockModel.create([_call("Paris"), _text("model", "18 degrees in Paris.")])
    async with NousSessionService(url) as service:
        runner = _runner(service, model)
        await service.create_session(app_name=APP, user_id=USER, session_id="chat")
        produced = await _turn(runner, "chat", "Weather in Paris?")
        assert produced[-1].content is not None
        assert produced[-1].content.parts[0].text == "18 degrees in Paris."
        live = await service.get_session(app_name=APP, user_id=USER, session_id="chat")
        assert live is not None
        surface = await _surface(service, "chat")
        await runner.close()

    # The user's message, the model's call, the tool's result, the answer: on the surface.
    assert [m.role for m in surface] == [Role.USER, Role.ASSISTANT, Role.TOOL, Role.ASSISTANT]
    assert surface[0].text == "Weather in Paris?"
    assert surface[1].tool_calls[0].name == "get_weather"
    assert surface[1].tool_calls[0].arguments == {"city": "Paris"}
    assert surface[3].text == "18 degrees in Paris."
    assert all(m.metadata["adk_event_id"] for m in surface)

    # Reopened as after a restart: the same events, losslessly, and the run goes on from them.
    model = MockModel.create([_text("model", "Still 18.")])
    async with NousSessionService(url) as service:
        reopened = await service.get_session(app_name=APP, user_id=USER, session_id="chat")
        assert reopened is not None
        assert [e.model_dump() for e in reopened.events] == [e.model_dump() for e in live.events]
        assert len(reopened.events) == 4
        runner = _runner(service, model)
        await _turn(runner, "chat", "And now?")
        await runner.close()
        # The model was sent the whole conversation read back from the file.
        sent = model.requests[0].contents
        assert [c.role for c in sent] == ["user", "model", "user", "model", "user"]
        assert sent[0].parts[0].text == "Weather in Paris?"
        assert sent[2].parts[0].function_response.response == {"city": "Paris", "celsius": 18}
        assert len(await _surface(service, "chat")) == 6


async def test_runner_run_from_worker_threads_each_on_its_own_loop(tmp_path: Path) -> None:
    """``Runner.run`` (sync) runs each turn under a fresh ``asyncio.run`` in a thread: the
    service serves them all from its portal."""
    url = f"sqlite:///{tmp_path / 'adk.sqlite3'}"
    model = MockModel.create([_text("model", "one"), _text("model", "two")])
    async with NousSessionService(url) as service:
        runner = _runner(service, model)
        await service.create_session(app_name=APP, user_id=USER, session_id="sync")

        def run(text: str) -> list[Event]:
            return list(
                runner.run(user_id=USER, session_id="sync", new_message=_text("user", text))
            )

        first = await asyncio.to_thread(run, "hi")
        second = await asyncio.to_thread(run, "again")
        await runner.close()
        assert first[-1].content.parts[0].text == "one"
        assert second[-1].content.parts[0].text == "two"
        session = await service.get_session(app_name=APP, user_id=USER, session_id="sync")
        assert session is not None
        assert [e.author for e in session.events] == ["user", "assistant", "user", "assistant"]


async def test_a_stale_session_object_is_refused() -> None:
    async with NousSessionService() as service:
        session = await service.create_session(app_name=APP, user_id=USER)
        stale = session.model_copy(deep=True)
        await service.append_event(session, Event(author="user", invocation_id="winner"))
        with pytest.raises(StaleSessionError, match="modified in storage"):
            await service.append_event(stale, Event(author="user", invocation_id="stale"))
        # Concurrent writers holding the same revision: exactly one lands.
        fresh = await service.get_session(app_name=APP, user_id=USER, session_id=session.id)
        assert fresh is not None
        copies = [fresh.model_copy(deep=True) for _ in range(2)]
        results = await asyncio.gather(
            *(
                service.append_event(copy, Event(author="user", invocation_id=f"c{i}"))
                for i, copy in enumerate(copies)
            ),
            return_exceptions=True,
        )
        assert sum(isinstance(r, StaleSessionError) for r in results) == 1
        final = await service.get_session(app_name=APP, user_id=USER, session_id=session.id)
        assert final is not None
        assert len(final.events) == 2
        # The object that won can go on appending.
        winner = copies[[isinstance(r, Event) for r in results].index(True)]
        await service.append_event(winner, Event(author="user", invocation_id="next"))


@pytest.fixture(params=["sqlite", "postgres"])
def shared_url(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    """A store two services share: a SQLite file, or a fresh PostgreSQL schema."""
    if request.param == "sqlite":
        yield f"sqlite:///{tmp_path / 'adk.sqlite3'}"
        return
    if not POSTGRES:
        pytest.skip("no PostgreSQL server: set NOUS_SESSION_TEST_POSTGRES=postgresql://...")
    psycopg = pytest.importorskip("psycopg")
    schema = f"t_{uuid.uuid4().hex[:16]}"
    yield f"{POSTGRES}?schema={schema}"
    with psycopg.connect(POSTGRES, autocommit=True) as connection:
        connection.execute(f"DROP SCHEMA IF EXISTS {schema} CASCADE")


async def test_a_commit_lost_to_another_process_is_a_stale_session(shared_url: str) -> None:
    """Two services on one store are two writers, as two processes would be: the one that
    did not see the other's commit gets nous_session's ConflictError from the store, raised
    as ADK's StaleSessionError, and nothing of it is stored. The first does not follow the
    store's change feed: one that does may hear of the other's commit first (a stale marker,
    refused before the store is asked)."""
    url = shared_url
    portal = SessionsPortal(url, follow=False)
    try:
        async with (
            NousSessionService(sessions=portal) as first,
            NousSessionService(url) as second,
        ):
            created = await first.create_session(app_name=APP, user_id=USER, session_id="s")
            mine = await first.get_session(app_name=APP, user_id=USER, session_id="s")
            theirs = await second.get_session(app_name=APP, user_id=USER, session_id="s")
            assert mine is not None
            assert theirs is not None
            assert mine == created
            await second.append_event(theirs, Event(author="user", invocation_id="theirs"))
            with pytest.raises(StaleSessionError) as raised:
                await first.append_event(mine, Event(author="user", invocation_id="mine"))
            assert type(raised.value.__cause__).__name__ == "ConflictError"
            again = await first.get_session(app_name=APP, user_id=USER, session_id="s")
            assert again is not None
            assert [e.invocation_id for e in again.events] == ["theirs"]
            await first.append_event(again, Event(author="user", invocation_id="mine"))
            final = await second.get_session(app_name=APP, user_id=USER, session_id="s")
            assert final is not None
            assert [e.invocation_id for e in final.events] == ["theirs", "mine"]
    finally:
        await anyio.to_thread.run_sync(portal.close)


async def test_state_deltas_are_scoped_as_adk_scopes_them(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'adk.sqlite3'}"
    async with NousSessionService(url) as service:
        session = await service.create_session(
            app_name=APP,
            user_id=USER,
            session_id="s1",
            state={"app:model": "mock", "user:lang": "fr", "topic": "weather", "temp:x": 1},
        )
        assert session.state == {"app:model": "mock", "user:lang": "fr", "topic": "weather"}
        delta = {"app:calls": 1, "user:lang": "en", "topic": None, "temp:scratch": "gone"}
        event = Event(author="user", actions=EventActions(state_delta=delta))
        await service.append_event(session, event)
        assert session.state["temp:scratch"] == "gone"  # for the rest of the invocation only
        assert "temp:scratch" not in event.actions.state_delta
        other_user = await service.create_session(app_name=APP, user_id="u2", session_id="s2")
        assert other_user.state == {"app:model": "mock", "app:calls": 1}
        same_user = await service.create_session(app_name=APP, user_id=USER, session_id="s3")
        assert same_user.state == {"app:model": "mock", "app:calls": 1, "user:lang": "en"}
        assert await service.get_user_state(app_name=APP, user_id=USER) == {"lang": "en"}
        assert await service.get_user_state(app_name="other", user_id=USER) == {}

    async with NousSessionService(url) as service:  # reopened
        again = await service.get_session(app_name=APP, user_id=USER, session_id="s1")
        assert again is not None
        assert again.state == {
            "app:model": "mock",
            "app:calls": 1,
            "user:lang": "en",
            "topic": None,
        }
        listed = await service.list_sessions(app_name=APP)
        assert [(s.user_id, s.id) for s in listed.sessions] == [
            (USER, "s1"),
            ("u2", "s2"),
            (USER, "s3"),
        ]
        assert all(not s.events for s in listed.sessions)


async def test_an_adk_compaction_replaces_the_compacted_range_on_the_surface() -> None:
    async with NousSessionService() as service:
        session = await service.create_session(app_name=APP, user_id=USER, session_id="c")
        for i in range(4):
            role = "user" if i % 2 == 0 else "model"
            author = "user" if role == "user" else "assistant"
            event = Event(author=author, content=_text(role, f"m{i}"), timestamp=100.0 + i)
            await service.append_event(session, event)
        compaction = EventCompaction(
            start_timestamp=100.0,
            end_timestamp=102.0,
            compacted_content=_text("model", "summary of m0..m2"),
        )
        await service.append_event(
            session,
            Event(author="user", actions=EventActions(compaction=compaction), timestamp=104.0),
        )
        surface = await _surface(service, "c")
        assert [m.text for m in surface] == ["summary of m0..m2", "m3"]
        # ADK reads its events, the compaction event included, all of them, as it wrote them.
        read = await service.get_session(app_name=APP, user_id=USER, session_id="c")
        assert read is not None
        assert len(read.events) == 5
        assert read.events[-1].actions.compaction == compaction
        # The log keeps the compacted messages: un-compacting shows them again.
        events = await _events(service, "c")
        replace = next(e for e in events if e.type == "replace")

        async def uncompact(actor: SessionActor) -> list[str | None]:
            await actor.uncompact(replace.seq)
            return [m.text for m in actor.messages()]

        shown = await service.portal.acall(service.session_id(APP, USER, "c"), uncompact)
        assert shown == ["m0", "m1", "m2", "m3"]


# ADK marks its compaction config experimental with a UserWarning on construction.
@pytest.mark.filterwarnings(r"ignore:\[EXPERIMENTAL\] EventsCompactionConfig:UserWarning")
async def test_adk_own_compaction_under_a_runner_becomes_a_replace(tmp_path: Path) -> None:
    """ADK's App-level compaction (its LlmEventSummarizer, on the offline model) appends an
    event carrying an EventCompaction; the surface shows its summary in place of the two
    turns it compacted, and ADK still reads every event back."""
    model = MockModel.create([_text("model", "a1"), _text("model", "a2")])
    summarizer = LlmEventSummarizer(llm=MockModel.create([_text("model", "SUMMARY")]))
    config = EventsCompactionConfig(summarizer=summarizer, compaction_interval=2, overlap_size=0)
    agent = Agent(name="assistant", model=model)
    app = App(name=APP, root_agent=agent, events_compaction_config=config)
    async with NousSessionService(f"sqlite:///{tmp_path / 'adk.sqlite3'}") as service:
        runner = Runner(app=app, session_service=service)
        await service.create_session(app_name=APP, user_id=USER, session_id="long")
        await _turn(runner, "long", "q1")
        await _turn(runner, "long", "q2")
        await runner.close()
        read = await service.get_session(app_name=APP, user_id=USER, session_id="long")
        assert read is not None
        assert [e.author for e in read.events] == ["user", "assistant"] * 2 + ["user"]
        assert read.events[-1].actions.compaction is not None
        assert [m.text for m in await _surface(service, "long")] == ["SUMMARY"]
        kinds = [e.type for e in await _events(service, "long")]
        assert kinds.count("replace") == 1


async def test_events_are_stored_once_and_config_filters_them() -> None:
    async with NousSessionService() as service:
        session = await service.create_session(app_name=APP, user_id=USER, session_id="d")
        event = Event(author="user", content=_text("user", "hello"), timestamp=10.0)
        await service.append_event(session, event)
        # Delivered again (the same object, then an equal copy): stored and applied once.
        await service.append_event(session, event)
        await service.append_event(session, event.model_copy(deep=True))
        for i in range(1, 4):
            await service.append_event(session, Event(author="user", timestamp=10.0 + i))
        kinds = [e.type for e in await _events(service, "d")]
        assert kinds.count(EVENT_EVENT) == 4
        assert kinds[0] == CREATED_EVENT
        got = await service.get_session(
            app_name=APP,
            user_id=USER,
            session_id="d",
            config=GetSessionConfig(num_recent_events=2, after_timestamp=11.0),
        )
        assert got is not None
        assert [e.timestamp for e in got.events] == [12.0, 13.0]
        partial = Event(author="user", partial=True, content=_text("user", "typing"))
        assert await service.append_event(session, partial) is partial
        assert len(await _events(service, "d")) == len(kinds)


async def test_delete_keeps_the_log_and_frees_the_id() -> None:
    async with NousSessionService() as service:
        session = await service.create_session(app_name=APP, user_id=USER, session_id="x")
        await service.append_event(session, Event(author="user", content=_text("user", "hi")))
        with pytest.raises(AlreadyExistsError):
            await service.create_session(app_name=APP, user_id=USER, session_id=" x ")
        await service.delete_session(app_name=APP, user_id=USER, session_id="x")
        await service.delete_session(app_name=APP, user_id=USER, session_id="x")  # no-op
        assert await service.get_session(app_name=APP, user_id=USER, session_id="x") is None
        assert (await service.list_sessions(app_name=APP, user_id=USER)).sessions == []
        with pytest.raises(SessionNotFoundError):
            await service.append_event(session, Event(author="user"))
        assert await _surface(service, "x") == []
        again = await service.create_session(app_name=APP, user_id=USER, session_id="x")
        assert again.events == []
        kinds = [e.type for e in await _events(service, "x")]
        assert kinds.count(DELETED_EVENT) == 1
        assert kinds.count(EVENT_EVENT) == 1  # the first life's event stays in the log


async def test_ids_with_separators_never_share_a_session(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'adk.sqlite3'}"
    async with NousSessionService(url) as service:
        await service.create_session(app_name="a/b", user_id="c", session_id="d", state={"k": 1})
        await service.create_session(app_name="a", user_id="b/c", session_id="d", state={"k": 2})
        await service.create_session(app_name="a", user_id="b", session_id="c/d", state={"k": 3})
        await service.create_session(app_name="a%2F", user_id="b", session_id="c", state={"k": 4})
        ids = {
            service.session_id("a/b", "c", "d"),
            service.session_id("a", "b/c", "d"),
            service.session_id("a", "b", "c/d"),
            service.session_id("a%2F", "b", "c"),
        }
        assert len(ids) == 4
        listed = await service.list_sessions(app_name="a")
        assert sorted((s.user_id, s.id, s.state["k"]) for s in listed.sessions) == [
            ("b", "c/d", 3),
            ("b/c", "d", 2),
        ]
        got = await service.get_session(app_name="a/b", user_id="c", session_id="d")
        assert got is not None
        assert got.state == {"k": 1}
    # What ADK stored is plain nous_session: the CLI and any reader see these sessions.
    store = open_store(url, read_only=True)
    try:
        stored = {info.session_id for info in await store.sessions()}
    finally:
        await store.aclose()
    assert ids <= stored
    assert "adk:s/a%2F/b/c" not in stored  # "a/b" + "c": escaped, never split


async def test_events_and_state_read_back_exactly_beyond_64_bits(tmp_path: Path) -> None:
    """ADK's JSON is stored as the text ADK made: nothing is re-encoded on the way."""
    url = f"sqlite:///{tmp_path / 'adk.sqlite3'}"
    huge = 2**70 + 1
    call = types.FunctionCall(id="c", name="count", args={"n": huge, "x": 0.1 + 0.2})
    event = Event(
        author="assistant",
        content=types.Content(role="model", parts=[types.Part(function_call=call)]),
        actions=EventActions(state_delta={"n": huge, "user:n": huge}),
    )
    async with NousSessionService(url) as service:
        session = await service.create_session(
            app_name=APP, user_id=USER, session_id="big", state={"seed": -huge}
        )
        await service.append_event(session, event)
    async with NousSessionService(url) as service:
        got = await service.get_session(app_name=APP, user_id=USER, session_id="big")
        assert got is not None
        assert got.events[0] == event
        assert got.events[0].content.parts[0].function_call.args == {"n": huge, "x": 0.1 + 0.2}
        assert got.state == {"seed": -huge, "n": huge, "user:n": huge}


async def test_an_equal_event_in_a_recreated_session_is_stored_again() -> None:
    """Re-delivery is recognised within one life of a session, not across a delete."""
    async with NousSessionService() as service:
        event = Event(id="e1", author="user", timestamp=5.0, content=_text("user", "same"))
        first = await service.create_session(app_name=APP, user_id=USER, session_id="r")
        await service.append_event(first, event.model_copy(deep=True))
        await service.delete_session(app_name=APP, user_id=USER, session_id="r")
        second = await service.create_session(app_name=APP, user_id=USER, session_id="r")
        await service.append_event(second, event.model_copy(deep=True))
        got = await service.get_session(app_name=APP, user_id=USER, session_id="r")
        assert got is not None
        assert [e.id for e in got.events] == ["e1"]
        assert [m.text for m in await _surface(service, "r")] == ["same"]


async def test_folds_beyond_the_cache_are_folded_again(monkeypatch: pytest.MonkeyPatch) -> None:
    """The service keeps the folds of the sessions used last; the others come back from
    their logs, the same."""
    monkeypatch.setattr(google_adk, "_CACHED", 2)
    async with NousSessionService() as service:
        for name in "abcd":
            session = await service.create_session(
                app_name=APP, user_id=name, session_id=name, state={"user:who": name}
            )
            await service.append_event(
                session, Event(author="user", actions=EventActions(state_delta={"n": name}))
            )
        for name in "abcd":
            got = await service.get_session(app_name=APP, user_id=name, session_id=name)
            assert got is not None
            assert got.state == {"user:who": name, "n": name}
            assert len(got.events) == 1
        assert len(service._logs._folds) <= 2
        assert len(service._logs._states) <= 2


async def test_an_event_delivered_again_after_its_state_was_lost_applies_it_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Regression: the app and user deltas go to their own sessions after the event commits.
    # A failure in between (the process dying, say) left them unapplied, and delivering the
    # event again found it stored and skipped them for good.
    url = f"sqlite:///{tmp_path / 'adk.sqlite3'}"
    delta = {"app:calls": 1, "user:lang": "en", "topic": "weather"}
    event = Event(author="user", actions=EventActions(state_delta=delta))
    async with NousSessionService(url) as service:
        session = await service.create_session(app_name=APP, user_id=USER, session_id="s1")
        real = NousSessionService._update_state

        async def lost(self: NousSessionService, *args: Any, **kwargs: Any) -> Any:
            raise RuntimeError("the process died here")

        monkeypatch.setattr(NousSessionService, "_update_state", lost)
        with pytest.raises(RuntimeError, match="died"):
            await service.append_event(session, event.model_copy(deep=True))
        monkeypatch.setattr(NousSessionService, "_update_state", real)
        assert await service.get_user_state(app_name=APP, user_id=USER) == {}

    async with NousSessionService(url) as service:  # the retry, after a restart
        session = await service.get_session(app_name=APP, user_id=USER, session_id="s1")
        assert session is not None
        for _ in range(2):  # delivered again, twice: stored once, applied once
            await service.append_event(session, event.model_copy(deep=True))
        assert await service.get_user_state(app_name=APP, user_id=USER) == {"lang": "en"}
        other = await service.create_session(app_name=APP, user_id="u2", session_id="s2")
        assert other.state == {"app:calls": 1}
        stored = [e for e in await _events(service, "s1") if e.type == EVENT_EVENT]
        assert len(stored) == 1
    async with (
        open_store(url) as store,
        SessionActor.open(session_id=service._app_id(APP), store=store, follow=False) as app_state,
    ):
        assert sum(e.type == google_adk.STATE_EVENT for e in app_state.log.events()) == 1


class FailingStore(MemoryStore):
    """A memory store whose commits to the sessions whose ids start with ``fail`` raise
    StoreError (nothing stored), and whose next commit to those starting with ``lose`` lands
    and then raises OutcomeUnknownError (its reply lost)."""

    fail: str | None = None
    lose: str | None = None
    fail_replace = False  # and every commit of a replace fails

    async def commit(self, session_id: str, **arguments: Any) -> str | None:
        replaces = any(e.type == "replace" for e in arguments["events"])
        if (self.fail is not None and session_id.startswith(self.fail)) or (
            self.fail_replace and replaces
        ):
            raise StoreError("the store is out of reach")
        uid = await super().commit(session_id, **arguments)
        if self.lose is not None and session_id.startswith(self.lose):
            self.lose = None
            raise OutcomeUnknownError("the reply was lost")
        return uid


async def _stored(service: NousSessionService, session_id: str) -> int:
    """How many ADK events the session's log holds."""
    return sum(e.type == EVENT_EVENT for e in await _events(service, session_id))


async def test_an_event_whose_state_delta_failed_is_finished_by_sending_it_again() -> None:
    """The event commits first, its app and user deltas after it: when they fail, the call
    is no StoreError (the event was stored) but OutcomeUnknownError, the session object
    holds the event, and sending the same event again with it applies the deltas, once."""
    store = FailingStore()
    delta = {"app:calls": 1, "user:lang": "en", "topic": "weather"}
    event = Event(author="user", actions=EventActions(state_delta=delta))
    async with NousSessionService(store) as service:
        session = await service.create_session(app_name=APP, user_id=USER, session_id="s")
        store.fail = "adk:a/"  # the app state's commit fails
        with pytest.raises(OutcomeUnknownError, match="append the same event again"):
            await service.append_event(session, event)
        assert session.events == [event]
        assert session.state["topic"] == "weather"
        assert await service.get_user_state(app_name=APP, user_id=USER) == {}
        store.fail = None
        for _ in range(2):  # the same session object, not a reloaded one; twice: once
            assert await service.append_event(session, event) is event
        assert session.events == [event]
        assert await service.get_user_state(app_name=APP, user_id=USER) == {"lang": "en"}
        other = await service.create_session(app_name=APP, user_id="u2", session_id="s2")
        assert other.state == {"app:calls": 1}
        assert await _stored(service, "s") == 1
        # The object is current: the next event appends as usual.
        await service.append_event(session, Event(author="user", content=_text("user", "hi")))
        read = await service.get_session(app_name=APP, user_id=USER, session_id="s")
        assert read is not None
        assert read.events == session.events
        assert read.state == session.state


async def test_an_event_whose_commit_outcome_was_lost_is_finished_by_sending_it_again() -> None:
    """The event's commit landed but its reply was lost: OutcomeUnknownError, and sending it
    again with the same session object finds it stored and brings the object up to date
    (it raised StaleSessionError once the service had read the log: the object was older)."""
    store = FailingStore()
    event = Event(author="user", actions=EventActions(state_delta={"user:lang": "en", "n": 1}))
    async with NousSessionService(store) as service:
        session = await service.create_session(app_name=APP, user_id=USER, session_id="s")
        store.lose = "adk:s/"
        with pytest.raises(OutcomeUnknownError):
            await service.append_event(session, event)
        assert session.events == []
        # A read meanwhile (the service now knows the event landed) leaves the object as old.
        read = await service.get_session(app_name=APP, user_id=USER, session_id="s")
        assert read is not None
        assert read.events == [event]
        await service.append_event(session, event)
        assert session.events == [event]
        assert session.state == {"user:lang": "en", "n": 1}
        assert await service.get_user_state(app_name=APP, user_id=USER) == {"lang": "en"}
        assert await _stored(service, "s") == 1
        await service.append_event(session, Event(author="user"))
        read = await service.get_session(app_name=APP, user_id=USER, session_id="s")
        assert read is not None
        assert read.events == session.events


async def test_a_failed_event_commit_stores_nothing_and_is_a_store_error() -> None:
    store = FailingStore()
    event = Event(author="user", actions=EventActions(state_delta={"user:lang": "en"}))
    async with NousSessionService(store) as service:
        session = await service.create_session(app_name=APP, user_id=USER, session_id="s")
        store.fail = "adk:s/"
        with pytest.raises(StoreError):
            await service.append_event(session, event)
        assert session.events == []
        assert await service.get_user_state(app_name=APP, user_id=USER) == {}
        store.fail = None
        await service.append_event(session, event)  # the object was not stale: it appends
        assert await _stored(service, "s") == 1
        assert await service.get_user_state(app_name=APP, user_id=USER) == {"lang": "en"}


async def test_an_event_stored_after_writes_the_object_missed_is_still_stale() -> None:
    """Sending an event again finds it stored; an object read before another writer's event
    cannot take it, and stays stale (a fresh read holds it)."""
    store = FailingStore()
    event = Event(author="user", content=_text("user", "mine"))
    async with NousSessionService(store) as service:
        old = await service.create_session(app_name=APP, user_id=USER, session_id="s")
        other = await service.get_session(app_name=APP, user_id=USER, session_id="s")
        assert other is not None
        await service.append_event(other, Event(author="user", content=_text("user", "theirs")))
        await service.append_event(other, event.model_copy(deep=True))
        with pytest.raises(StaleSessionError):
            await service.append_event(old, event.model_copy(deep=True))
        assert old.events == []
        assert await _stored(service, "s") == 2


async def test_a_compaction_whose_surface_replace_fails_is_still_appended() -> None:
    """The replace of the surface is a view of the stored event: its failure is logged and
    the call returns (a StoreError would say the event was not stored, and it was)."""
    store = FailingStore()
    async with NousSessionService(store) as service:
        session = await service.create_session(app_name=APP, user_id=USER, session_id="c")
        for i in range(2):
            event = Event(author="user", content=_text("user", f"m{i}"), timestamp=100.0 + i)
            await service.append_event(session, event)
        compaction = EventCompaction(
            start_timestamp=100.0, end_timestamp=101.0, compacted_content=_text("model", "sum")
        )
        compacting = Event(author="user", actions=EventActions(compaction=compaction))
        store.fail_replace = True
        assert await service.append_event(session, compacting) is compacting
        assert session.events[-1] is compacting
        assert [m.text for m in await _surface(service, "c")] == ["m0", "m1"]
        read = await service.get_session(app_name=APP, user_id=USER, session_id="c")
        assert read is not None
        assert read.events == session.events
