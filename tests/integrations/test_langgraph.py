"""The LangGraph adapter (nous_session.integrations.langgraph).

Two kinds of test:

* LangGraph's own contract, the ``langgraph-checkpoint-conformance`` suite, run unmodified
  against NousSessionSaver (its ``validate()`` over a factory, as the suite's README says) on
  the memory and SQLite stores, and PostgreSQL when NOUS_SESSION_TEST_POSTGRES is set. The
  saver is anyio and the suite only awaits it, so this runs on asyncio and on trio.
* Real graphs: a StateGraph with a messages channel, a model node calling a tool, a tool
  node and a human-review node that interrupts, run with the saver, resumed, reopened from
  the SQLite file after a "restart", continued. LangGraph itself runs only on asyncio (its
  runner is built on asyncio tasks and futures), so these tests pin the asyncio backend.
"""

from __future__ import annotations

import copy
import os
import uuid
from collections.abc import AsyncIterator, Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import anyio
import anyio.from_thread
import anyio.to_thread
import pytest

pytest.importorskip("langgraph")

from langchain_core.messages import (
    AIMessage,
    HumanMessage,
    RemoveMessage,
    ToolMessage,
)
from langgraph.checkpoint.conformance import checkpointer_test, validate
from langgraph.checkpoint.conformance.capabilities import Capability
from langgraph.graph import END, START, MessagesState, StateGraph
from langgraph.types import Command, interrupt

from nous_session import Role, SessionActor, open_store
from nous_session.integrations.langgraph import (
    CHECKPOINT_EVENT,
    WRITES_EVENT,
    NousSessionSaver,
)

POSTGRES = os.environ.get("NOUS_SESSION_TEST_POSTGRES", "")
ASYNCIO_ONLY = pytest.mark.parametrize(
    "anyio_backend", [pytest.param(("asyncio", {"use_uvloop": False}), id="asyncio")]
)

# The suite's tests per capability, as langgraph-checkpoint-conformance 0.0.2 has them: every
# capability is detected on NousSessionSaver (it overrides every a... method), none skipped.
SUITE = {
    "put": 17,
    "put_writes": 10,
    "get_tuple": 10,
    "list": 16,
    "delete_thread": 5,
    "delete_for_runs": 7,
    "copy_thread": 8,
    "prune": 8,
}


# The conformance suite ------------------------------------------------------------------------


@pytest.fixture
def postgres_url() -> Iterator[str]:
    if not POSTGRES:
        pytest.skip("no PostgreSQL server: set NOUS_SESSION_TEST_POSTGRES=postgresql://...")
    psycopg = pytest.importorskip("psycopg")
    schemas: list[str] = []

    def url() -> str:
        schemas.append(f"t_{uuid.uuid4().hex[:16]}")
        return f"{POSTGRES}?schema={schemas[-1]}"

    yield url  # type: ignore[misc]
    with psycopg.connect(POSTGRES, autocommit=True) as connection:
        for schema in schemas:
            connection.execute(f"DROP SCHEMA IF EXISTS {schema} CASCADE")


async def run_suite(urls: Any) -> None:
    """Run the whole suite, a fresh saver over a fresh store for each capability."""

    @checkpointer_test(name="NousSessionSaver")
    async def factory() -> AsyncIterator[NousSessionSaver]:
        async with NousSessionSaver.open(urls()) as saver:
            yield saver

    report = await validate(factory)
    failures = [failure for result in report.results.values() for failure in result.failures]
    assert failures == []
    counts = {
        name: (result.tests_passed, result.tests_failed, result.tests_skipped)
        for name, result in report.results.items()
    }
    assert counts == {name: (passed, 0, 0) for name, passed in SUITE.items()}
    assert set(report.results) == {capability.value for capability in Capability}
    assert report.conformance_level() == "FULL"


@pytest.mark.anyio
async def test_the_conformance_suite_passes_whole_on_the_memory_store() -> None:
    await run_suite(lambda: "memory:")


@pytest.mark.anyio
async def test_the_conformance_suite_passes_whole_on_sqlite(tmp_path: Path) -> None:
    files = iter(range(100))
    await run_suite(lambda: f"sqlite:///{tmp_path / f'suite-{next(files)}.sqlite3'}")


@pytest.mark.anyio
async def test_the_conformance_suite_passes_whole_on_postgres(postgres_url: Any) -> None:
    await run_suite(postgres_url)


# Real graphs ----------------------------------------------------------------------------------


def build_graph() -> StateGraph[Any]:
    """model -> tools -> model -> review (interrupts for a human) -> END.

    The model is a deterministic stand-in: it calls the weather tool when the last message is
    the user's, and answers from the tool's result otherwise.
    """

    def model(state: MessagesState) -> dict[str, Any]:
        last = state["messages"][-1]
        turn = sum(isinstance(message, HumanMessage) for message in state["messages"])
        if isinstance(last, HumanMessage):
            call = {"id": f"call_{turn}", "name": "weather", "args": {"city": last.content}}
            return {"messages": [AIMessage("", id=f"ai-call-{turn}", tool_calls=[call])]}
        return {"messages": [AIMessage(f"It is sunny ({last.content}).", id=f"ai-{turn}")]}

    def tools(state: MessagesState) -> dict[str, Any]:
        call = state["messages"][-1].tool_calls[0]  # type: ignore[attr-defined]
        result = f"18C in {call['args']['city']}"
        return {
            "messages": [
                ToolMessage(result, tool_call_id=call["id"], name="weather", id=f"t-{call['id']}")
            ]
        }

    def review(state: MessagesState) -> dict[str, Any]:
        verdict = interrupt({"question": "send this answer?", "answer": state["messages"][-1].text})
        if verdict == "ok":
            return {}
        turn = sum(isinstance(message, HumanMessage) for message in state["messages"])
        return {"messages": [AIMessage(f"(edited) {verdict}", id=f"ai-{turn}")]}

    def route(state: MessagesState) -> str:
        return "tools" if state["messages"][-1].tool_calls else "review"  # type: ignore[attr-defined]

    builder = StateGraph(MessagesState)
    builder.add_node("model", model)
    builder.add_node("tools", tools)
    builder.add_node("review", review)
    builder.add_edge(START, "model")
    builder.add_conditional_edges("model", route, ["tools", "review"])
    builder.add_edge("tools", "model")
    builder.add_edge("review", END)
    return builder


def texts(messages: Any) -> list[str]:
    return [message.text for message in messages]


@ASYNCIO_ONLY
@pytest.mark.anyio
async def test_a_graph_interrupts_resumes_and_continues_after_a_restart(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'graph.sqlite3'}"
    config: Any = {"configurable": {"thread_id": "chat-1"}}
    async with NousSessionSaver.open(url) as saver:
        graph = build_graph().compile(checkpointer=saver)
        result = await graph.ainvoke({"messages": [HumanMessage("Paris", id="h-1")]}, config)
        assert result["__interrupt__"][0].value["answer"] == "It is sunny (18C in Paris)."
        state = await graph.aget_state(config)
        assert state.next == ("review",)
        result = await graph.ainvoke(Command(resume="ok"), config)
        assert texts(result["messages"]) == [
            "Paris",
            "",
            "18C in Paris",
            "It is sunny (18C in Paris).",
        ]

    # A new process: everything comes back from the SQLite file.
    async with NousSessionSaver.open(url) as saver:
        graph = build_graph().compile(checkpointer=saver)
        state = await graph.aget_state(config)
        assert state.next == ()
        assert texts(state.values["messages"])[-1] == "It is sunny (18C in Paris)."
        result = await graph.ainvoke({"messages": [HumanMessage("Oslo", id="h-2")]}, config)
        assert "__interrupt__" in result
        result = await graph.ainvoke(Command(resume="Cold, take a coat."), config)
        assert texts(result["messages"])[4:] == [
            "Oslo",
            "",
            "18C in Oslo",
            "(edited) Cold, take a coat.",  # the review's edit replaced the model's answer
        ]
        history = [snapshot async for snapshot in graph.aget_state_history(config)]
        assert len(history) > 8
        assert history[0].values["messages"] == result["messages"]

    # The thread is one session: the checkpoints are custom events, the conversation is on
    # the surface (LangChain ids kept), and nothing of LangGraph's reaches it.
    async with SessionActor.open(session_id="langgraph:chat-1", store=url) as session:
        kinds = {event.type for event in session.log.events()}
        assert {CHECKPOINT_EVENT, WRITES_EVENT} <= kinds
        shown = session.messages()
        assert [message.role for message in shown] == [
            Role.USER,
            Role.ASSISTANT,
            Role.TOOL,
            Role.ASSISTANT,
            Role.USER,
            Role.ASSISTANT,
            Role.TOOL,
            Role.ASSISTANT,
        ]
        assert shown[-1].text == "(edited) Cold, take a coat."  # the surface was replaced
        assert shown[1].tool_calls[0].name == "weather"
        assert shown[2].tool_call_id == "call_1"
        assert [message.metadata["langgraph_id"] for message in shown] == [
            message.id for message in result["messages"]
        ]


@ASYNCIO_ONLY
@pytest.mark.anyio
async def test_a_snapshot_of_the_session_keeps_every_checkpoint(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'snap.sqlite3'}"
    config: Any = {"configurable": {"thread_id": "s"}}
    async with NousSessionSaver.open(url) as saver:
        graph = build_graph().compile(checkpointer=saver)
        await graph.ainvoke({"messages": [HumanMessage("Rome", id="h-1")]}, config)
        await graph.ainvoke(Command(resume="ok"), config)
        before = [snapshot.config async for snapshot in graph.aget_state_history(config)]
    async with SessionActor.open(session_id="langgraph:s", store=url) as session:
        await session.snapshot()
    async with NousSessionSaver.open(url) as saver:
        graph = build_graph().compile(checkpointer=saver)
        after = [snapshot.config async for snapshot in graph.aget_state_history(config)]
        assert after == before
        assert texts((await graph.aget_state(config)).values["messages"])[-1].startswith("It is")


@ASYNCIO_ONLY
@pytest.mark.anyio
async def test_a_removed_message_replaces_the_surface_and_keeps_the_history() -> None:
    config: Any = {"configurable": {"thread_id": "edit"}}
    async with NousSessionSaver.open() as saver:
        graph = build_graph().compile(checkpointer=saver)
        await graph.ainvoke({"messages": [HumanMessage("Lima", id="h-1")]}, config)
        await graph.ainvoke(Command(resume="ok"), config)
        await graph.aupdate_state(config, {"messages": [RemoveMessage(id="t-call_1")]})
        state = await graph.aget_state(config)
        assert "18C in Lima" not in texts(state.values["messages"])
        async with SessionActor.open(session_id="langgraph:edit", store=saver.store) as session:
            assert texts(session.messages()) == texts(state.values["messages"])
            assert any(e.data.get("content") == "18C in Lima" for e in session.log.events())


@ASYNCIO_ONLY
@pytest.mark.anyio
async def test_the_sync_interface_works_from_another_thread_and_refuses_on_the_loop() -> None:
    config: Any = {"configurable": {"thread_id": "sync"}}
    async with NousSessionSaver.open() as saver:
        graph = build_graph().compile(checkpointer=saver)

        def run() -> Any:
            graph.invoke({"messages": [HumanMessage("Kyiv", id="h-1")]}, config)
            return graph.invoke(Command(resume="ok"), config)

        result = await anyio.to_thread.run_sync(run)
        assert texts(result["messages"])[-1] == "It is sunny (18C in Kyiv)."
        assert (await saver.aget_tuple(config)) is not None
        listed = await anyio.to_thread.run_sync(lambda: list(saver.list(config, limit=2)))
        assert len(listed) == 2
        with pytest.raises(RuntimeError, match="deadlock"):
            saver.get_tuple(config)


@pytest.mark.anyio
async def test_checkpoints_stream_to_subscribers_and_survive_other_sessions(
    tmp_path: Path,
) -> None:
    """The saver shares its store: other sessions stay untouched, and a subscriber of the
    thread's session sees each checkpoint as it is committed (asyncio and trio)."""
    store = open_store(f"sqlite:///{tmp_path / 'shared.sqlite3'}")
    try:
        async with SessionActor.open(session_id="other", store=store) as other:
            await other.append("user_message", {"content": "not LangGraph's"})
        async with NousSessionSaver.open(store) as saver:
            config: Any = {"configurable": {"thread_id": "t", "checkpoint_ns": ""}}
            checkpoint: Any = {
                "v": 4,
                "id": "1f0",
                "ts": "2026-01-01T00:00:00+00:00",
                "channel_values": {"a": 1},
                "channel_versions": {"a": "1"},
                "versions_seen": {},
                "updated_channels": None,
            }
            async with saver.session("t") as watcher, watcher.subscribe() as events:
                await saver.aput(config, checkpoint, {"step": 0}, {"a": "1"})
                with anyio.fail_after(10):
                    async for event in events:
                        assert event.type == CHECKPOINT_EVENT
                        break
            assert [t.checkpoint["id"] async for t in saver.alist(None)] == ["1f0"]
            await saver.adelete_thread("t")
        assert [info.session_id for info in await store.sessions()] == ["other"]
    finally:
        await store.aclose()


@pytest.mark.anyio
async def test_idle_threads_beyond_the_limit_are_closed_and_reopened_from_the_store(
    tmp_path: Path,
) -> None:
    url = f"sqlite:///{tmp_path / 'many.sqlite3'}"
    async with NousSessionSaver.open(url, max_open_threads=2) as saver:
        for number in range(6):
            config: Any = {"configurable": {"thread_id": f"t{number}", "checkpoint_ns": ""}}
            checkpoint: Any = {
                "v": 4,
                "id": f"1f{number}",
                "ts": "2026-01-01T00:00:00+00:00",
                "channel_values": {"n": number},
                "channel_versions": {"n": "1"},
                "versions_seen": {},
                "updated_channels": None,
            }
            await saver.aput(config, checkpoint, {"step": number}, {"n": "1"})
        assert len(saver._threads) <= 2
        async with saver.session("t5") as pinned:
            for number in range(6):  # each one reopened in turn, t5 kept while pinned
                config = {"configurable": {"thread_id": f"t{number}"}}
                found = await saver.aget_tuple(config)
                assert found is not None
                assert found.checkpoint["channel_values"] == {"n": number}
                assert not pinned.closed
        assert len(saver._threads) <= 2
        listed = [t.config["configurable"]["thread_id"] async for t in saver.alist(None)]
        assert sorted(listed) == [f"t{number}" for number in range(6)]


@pytest.mark.anyio
async def test_listing_every_thread_goes_through_the_stores_index(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A thread's first checkpoint marks its session as this saver's, so alist(None) finds
    # the threads from the index and never reads every session id of the store.
    store = open_store(f"sqlite:///{tmp_path / 'listed.sqlite3'}")
    try:
        for number in range(30):  # other applications' sessions, with the saver's prefix too
            async with SessionActor.open(session_id=f"langgraph:x{number}", store=store) as s:
                await s.append("user_message", {"content": "not a thread"})
        async with NousSessionSaver.open(store) as saver:
            for number in range(3):
                config: Any = {"configurable": {"thread_id": f"t{number}", "checkpoint_ns": ""}}
                checkpoint: Any = {
                    "v": 4,
                    "id": f"1f{number}",
                    "ts": "2026-01-01T00:00:00+00:00",
                    "channel_values": {"n": number},
                    "channel_versions": {"n": "1"},
                    "versions_seen": {},
                    "updated_channels": None,
                }
                await saver.aput(config, checkpoint, {"step": number}, {"n": "1"})
                await saver.aput(config, {**checkpoint, "id": f"2f{number}"}, {}, {})

            async def refused(self: Any) -> list[Any]:
                raise AssertionError("alist(None) read every session id")

            with monkeypatch.context() as patched:
                patched.setattr(type(store), "sessions", refused)
                listed = [t.config["configurable"]["thread_id"] async for t in saver.alist(None)]
            assert sorted(listed) == ["t0", "t0", "t1", "t1", "t2", "t2"]
        page = await store.list_sessions(where={"app": "langgraph"})
        assert sorted(e.session_id for e in page.sessions) == [f"langgraph:t{n}" for n in range(3)]
        assert all(e.count == 3 for e in page.sessions)  # one metadata event, not one a put
    finally:
        await store.aclose()


@pytest.mark.anyio
async def test_a_thread_id_too_long_for_a_session_is_refused_and_the_saver_goes_on() -> None:
    async with NousSessionSaver.open() as saver:
        with pytest.raises(ValueError, match="session_id"):
            await saver.aget_tuple({"configurable": {"thread_id": "x" * 300}})
        assert await saver.aget_tuple({"configurable": {"thread_id": "ok"}}) is None


@ASYNCIO_ONLY
@pytest.mark.anyio
async def test_messages_that_cannot_be_projected_never_fail_the_checkpoint() -> None:
    """A tool call whose arguments are not JSON (a datetime: LangGraph's serde keeps it,
    a nous_session message cannot) is stored in the checkpoint and left off the surface."""
    config: Any = {"configurable": {"thread_id": "odd"}}

    def model(state: MessagesState) -> dict[str, Any]:
        call = {"id": "c1", "name": "at", "args": {"when": datetime(2026, 1, 1, tzinfo=UTC)}}
        return {"messages": [AIMessage("", id="a1", tool_calls=[call])]}

    builder = StateGraph(MessagesState)
    builder.add_node("model", model)
    builder.add_edge(START, "model")
    async with NousSessionSaver.open() as saver:
        graph = builder.compile(checkpointer=saver)
        result = await graph.ainvoke({"messages": [HumanMessage("when?", id="h1")]}, config)
        state = await graph.aget_state(config)
        assert state.values["messages"] == result["messages"]
        assert state.values["messages"][-1].tool_calls[0]["args"]["when"].year == 2026
        async with saver.session("odd") as session:
            assert texts(session.messages()) == ["when?"]


@ASYNCIO_ONLY
@pytest.mark.anyio
async def test_concurrent_graphs_on_many_threads_lose_nothing(tmp_path: Path) -> None:
    """Twelve conversations at once, two turns each, through a saver that keeps only three
    threads open: every checkpoint and every message lands, and survives a reopen."""
    url = f"sqlite:///{tmp_path / 'busy.sqlite3'}"

    async def converse(graph: Any, number: int) -> None:
        config = {"configurable": {"thread_id": f"c{number}"}}
        for city in (f"A{number}", f"B{number}"):
            await graph.ainvoke({"messages": [HumanMessage(city, id=f"h-{city}")]}, config)
            await graph.ainvoke(Command(resume="ok"), config)

    async with NousSessionSaver.open(url, max_open_threads=3) as saver:
        graph = build_graph().compile(checkpointer=saver)
        async with anyio.create_task_group() as group:
            for number in range(12):
                group.start_soon(converse, graph, number)
        assert len(saver._threads) <= 3
    async with NousSessionSaver.open(url) as saver:
        graph = build_graph().compile(checkpointer=saver)
        for number in range(12):
            config: Any = {"configurable": {"thread_id": f"c{number}"}}
            state = await graph.aget_state(config)
            assert texts(state.values["messages"])[::4] == [f"A{number}", f"B{number}"]
            assert len(state.values["messages"]) == 8
            async with saver.session(f"c{number}") as session:
                assert texts(session.messages()) == texts(state.values["messages"])


@pytest.mark.anyio
async def test_a_closed_saver_refuses_calls() -> None:
    async with NousSessionSaver.open() as saver:
        assert await saver.aget_tuple({"configurable": {"thread_id": "t"}}) is None
        clone = copy.copy(saver)  # what with_allowlist gives a compiled graph, strict serde on
    for closed in (saver, clone):
        with pytest.raises(RuntimeError, match="closed"):
            await closed.aget_tuple({"configurable": {"thread_id": "t"}})


@pytest.mark.anyio
async def test_two_savers_on_one_file_run_one_thread_in_turn(tmp_path: Path) -> None:
    """Two processes' savers (two stores on one SQLite file) take turns on a thread: each
    reads what the other wrote last, and neither write conflicts."""
    url = f"sqlite:///{tmp_path / 'shared.sqlite3'}"

    def checkpoint(number: int) -> Any:
        return {
            "v": 4,
            "id": f"1f{number:02}",
            "ts": "2026-01-01T00:00:00+00:00",
            "channel_values": {"n": number},
            "channel_versions": {"n": f"{number}"},
            "versions_seen": {},
            "updated_channels": None,
        }

    config: Any = {"configurable": {"thread_id": "t", "checkpoint_ns": ""}}
    async with NousSessionSaver.open(url) as first, NousSessionSaver.open(url) as second:
        parent = config
        for number in range(6):
            saver = (first, second)[number % 2]
            latest = await saver.aget_tuple(config)
            if number:
                assert latest is not None
                assert latest.checkpoint["channel_values"] == {"n": number - 1}
                parent = latest.config
            await saver.aput(parent, checkpoint(number), {"step": number}, {"n": f"{number}"})
        listed = [t.checkpoint["id"] async for t in first.alist(config)]
        assert listed == [f"1f{number:02}" for number in reversed(range(6))]


@pytest.mark.anyio
async def test_the_sync_methods_reach_the_saver_from_a_worker_thread_on_either_loop() -> None:
    config: Any = {"configurable": {"thread_id": "w", "checkpoint_ns": ""}}
    checkpoint: Any = {
        "v": 4,
        "id": "1f0",
        "ts": "2026-01-01T00:00:00+00:00",
        "channel_values": {"a": [1, 2]},
        "channel_versions": {"a": "1"},
        "versions_seen": {},
        "updated_channels": None,
    }
    async with NousSessionSaver.open() as saver:

        def work() -> Any:
            stored = saver.put(config, checkpoint, {"step": 0}, {"a": "1"})
            saver.put_writes(stored, [("a", 3)], "task")
            found = saver.get_tuple(config)
            saver.prune(["w"], strategy="delete")
            return stored, found, list(saver.list(config))

        stored, found, after = await anyio.to_thread.run_sync(work)
        assert stored["configurable"]["checkpoint_id"] == "1f0"
        assert found.checkpoint["channel_values"] == {"a": [1, 2]}
        assert found.pending_writes == [("task", "a", 3)]
        assert after == []


@pytest.mark.anyio
async def test_every_sync_method_is_its_async_pair_run_from_a_worker_thread() -> None:
    """The sync methods are made from LangGraph's async ones: each reports its pair's signature
    (inspect reads it), and copy, delete by run and delete reach the saver's loop too."""
    import inspect

    from langgraph.checkpoint.base import BaseCheckpointSaver

    config: Any = {"configurable": {"thread_id": "a", "checkpoint_ns": ""}}
    checkpoint: Any = {
        "v": 4,
        "id": "1f0",
        "ts": "2026-01-01T00:00:00+00:00",
        "channel_values": {},
        "channel_versions": {},
        "versions_seen": {},
        "updated_channels": None,
    }
    names = ["get_tuple", "list", "put", "put_writes", "delete_thread", "delete_for_runs"]
    async with NousSessionSaver.open() as saver:
        for name in [*names, "copy_thread", "prune"]:
            method = getattr(saver, name)
            assert inspect.signature(method) == inspect.signature(getattr(saver, f"a{name}"))
            assert method.__name__ == name
            assert f":meth:`a{name}`" in (method.__doc__ or "")
            assert getattr(BaseCheckpointSaver, name) is not getattr(type(saver), name)

        def work() -> list[Any]:
            saver.put(config, checkpoint, {"step": 0}, {})
            saver.copy_thread("a", "b")
            saver.delete_for_runs(["no-such-run"])
            copied = saver.get_tuple({"configurable": {"thread_id": "b", "checkpoint_ns": ""}})
            saver.delete_thread("a")
            return [copied, saver.get_tuple(config)]

        copied, deleted = await anyio.to_thread.run_sync(work)
        assert copied is not None
        assert copied.checkpoint["id"] == "1f0"
        assert deleted is None


@pytest.fixture(params=["asyncio", "trio"])
def far_saver(request: pytest.FixtureRequest) -> Iterator[tuple[NousSessionSaver, Any]]:
    """A saver opened on an event loop of its own (a portal's, in another thread), and that
    portal. Opened and closed outside the test's loop, which must not block on it."""
    with (
        anyio.from_thread.start_blocking_portal(request.param) as portal,
        portal.wrap_async_context_manager(NousSessionSaver.open()) as saver,
    ):
        yield saver, portal


@pytest.mark.anyio
async def test_the_saver_answers_when_awaited_from_another_event_loop(
    far_saver: tuple[NousSessionSaver, Any],
) -> None:
    """A saver opened on one loop and awaited from another: every a... method answers (it
    waited forever, with no error), and session() refuses at once."""
    saver, portal = far_saver
    config: Any = {"configurable": {"thread_id": "far", "checkpoint_ns": ""}}
    checkpoint: Any = {
        "v": 4,
        "id": "1f0",
        "ts": "2026-01-01T00:00:00+00:00",
        "channel_values": {"a": [1, 2]},
        "channel_versions": {"a": "1"},
        "versions_seen": {},
        "updated_channels": None,
    }
    with anyio.fail_after(30):
        stored = await saver.aput(config, checkpoint, {"step": 0}, {"a": "1"})
        await saver.aput_writes(stored, [("a", 3)], "task")
        found = await saver.aget_tuple(config)
        listed = [t.checkpoint["id"] async for t in saver.alist(config)]
        await saver.acopy_thread("far", "near")
        await saver.aprune(["near"], strategy="delete")
        # The saver's own loop still serves it as before.
        mine = await anyio.to_thread.run_sync(portal.call, saver.aget_tuple, config)
    assert found is not None
    assert found.checkpoint["channel_values"] == {"a": [1, 2]}
    assert found.pending_writes == [("task", "a", 3)]
    assert listed == ["1f0"]
    assert mine is not None
    assert mine.checkpoint["id"] == "1f0"
    with pytest.raises(RuntimeError, match="another one"):
        async with saver.session("far"):
            pass
