"""LangGraph: a ``StateGraph(MessagesState)`` (the ``add_messages`` reducer) with a checkpointer.

As its docs show: the graph is compiled with ``InMemorySaver()`` or with the saver that
``AsyncSqliteSaver.from_conn_string(path)`` yields (langgraph-checkpoint-sqlite); a session is a
``thread_id``; a message is appended by ``await graph.ainvoke({"messages": [message]}, config)``
and the history is read by ``(await graph.aget_state(config)).values["messages"]``. LangGraph
has no "last k" read: the tail is a slice of that history.

The graph has one node standing for the agent step. It returns no update: in a real agent it
would call the model, which this benchmark leaves out for every system alike.
"""

from __future__ import annotations

from collections.abc import Sequence
from contextlib import AsyncExitStack
from pathlib import Path
from typing import Any

from langchain_core.messages import (
    AIMessage,
    BaseMessage,
    HumanMessage,
    SystemMessage,
    ToolMessage,
)
from langgraph.checkpoint.memory import InMemorySaver
from langgraph.checkpoint.sqlite.aio import AsyncSqliteSaver
from langgraph.graph import END, START, MessagesState, StateGraph

from benchmarks.peers import MEMORY, SQLITE
from nous_session import Message


def _agent_step(state: MessagesState) -> dict[str, Any]:
    return {}


def _graph(checkpointer: Any) -> Any:
    builder = StateGraph(MessagesState)
    builder.add_node("agent", _agent_step)
    builder.add_edge(START, "agent")
    builder.add_edge("agent", END)
    return builder.compile(checkpointer=checkpointer)


def _message(message: Message) -> BaseMessage:
    if message.role == "system":
        return SystemMessage(content=message.text)
    if message.role == "user":
        return HumanMessage(content=message.text)
    if message.role == "tool":
        return ToolMessage(
            content=message.text, tool_call_id=message.tool_call_id or "", name=message.name
        )
    calls = [
        {"name": call.name, "args": dict(call.arguments), "id": call.id, "type": "tool_call"}
        for call in message.tool_calls
    ]
    return AIMessage(content=message.text, tool_calls=calls)


class LangGraphSession:
    def __init__(self, graph: Any, thread_id: str) -> None:
        self.graph = graph
        self.config = {"configurable": {"thread_id": thread_id}}

    async def append(self, unit: BaseMessage) -> None:
        await self.graph.ainvoke({"messages": [unit]}, self.config)

    async def history(self) -> Sequence[BaseMessage]:
        state = await self.graph.aget_state(self.config)
        return state.values.get("messages", [])  # type: ignore[no-any-return]

    async def tail(self, k: int) -> Sequence[BaseMessage]:
        state = await self.graph.aget_state(self.config)
        return state.values.get("messages", [])[-k:]  # type: ignore[no-any-return]

    async def fill(self, units: Sequence[BaseMessage]) -> None:
        await self.graph.ainvoke({"messages": list(units)}, self.config)


class LangGraphBackend:
    system = "langgraph"
    concurrent = True

    def __init__(self, kind: str, graph: Any, stack: AsyncExitStack) -> None:
        self.kind = kind
        self.graph = graph
        self.stack = stack

    def convert(self, message: Message) -> BaseMessage:
        return _message(message)

    def entries(self, unit: Any) -> int:
        return 1

    def text(self, entry: BaseMessage) -> str | None:
        return entry.content if isinstance(entry.content, str) else None

    async def session(self, session_id: str) -> LangGraphSession:
        return LangGraphSession(self.graph, session_id)

    async def close_session(self, session_id: str) -> None:
        pass

    async def aclose(self) -> None:
        await self.stack.aclose()


async def open_memory(path: Path | None = None) -> LangGraphBackend:
    return LangGraphBackend(MEMORY, _graph(InMemorySaver()), AsyncExitStack())


async def open_sqlite(path: Path | None) -> LangGraphBackend:
    assert path is not None
    stack = AsyncExitStack()
    saver = await stack.enter_async_context(AsyncSqliteSaver.from_conn_string(str(path)))
    return LangGraphBackend(SQLITE, _graph(saver), stack)
