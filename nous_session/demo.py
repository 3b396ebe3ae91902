"""The main demo: a scripted agent conversation on a SQLite file in the working directory.

A deterministic fake model (no network) answers a few hundred user turns, calling tools on some
of them. The session runs under a token budget, so compaction summarises older turns in the
background while the conversation goes on, and oversized tool results are pruned first. A live
subscriber prints what is committed as it happens. Then the session is closed and reopened, as
after a restart, to show that the surface and the full history are intact.

Unless told otherwise (a store URL, or ``$NOUS_SESSION_STORE``), the demo writes to
``nous_session_demo.sqlite3`` in the working directory, and says so before it writes anything.
"""

from __future__ import annotations

import os
import re
import sys
import time
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, TextIO

import anyio
import orjson

from nous_session.actor import SessionActor
from nous_session.compaction import CompactionPolicy
from nous_session.event import Event, EventType, to_message
from nous_session.log import Log
from nous_session.message import Message, Role, ToolCall
from nous_session.ops import Replace
from nous_session.stores import STORE_ENV, Store, open_store
from nous_session.transcript import estimate_messages_tokens

__all__ = ["DEMO_FILE", "FakeModel", "demo_store_url", "run_demo"]

DEMO_FILE = "nous_session_demo.sqlite3"
"""The demo's SQLite file, in the working directory, when no store is named."""

_CITIES = ("Paris", "Lagos", "Lima", "Osaka", "Oslo", "Quito", "Perth", "Cairo")
_TOPICS = ("event sourcing", "group commit", "tool calls", "compaction", "WAL mode", "trio")


class FakeModel:
    """A deterministic stand-in for an LLM: same turn number, same reply, no network."""

    def reply(self, turn: int, history: int) -> Message:
        """The assistant's answer to user turn ``turn`` (it may call a tool)."""
        if turn % 5 == 1:
            city = _CITIES[turn % len(_CITIES)]
            return Message.assistant(
                f"Let me check the weather in {city}.",
                tool_calls=[ToolCall(f"call_{turn}_w", "get_weather", {"city": city})],
            )
        if turn % 7 == 3:
            topic = _TOPICS[turn % len(_TOPICS)]
            return Message.assistant(
                None,
                tool_calls=[
                    ToolCall(f"call_{turn}_s", "search_docs", {"query": topic, "limit": 3}),
                    ToolCall(f"call_{turn}_c", "calculator", f'{{"expression": "{turn} * 12"}}'),
                ],
                reasoning_content=f"Two independent lookups for turn {turn}; run them in parallel.",
            )
        return Message.assistant(
            f"Turn {turn}: noted. I have {history} messages of context and I am keeping them "
            "tidy; ask me about the weather or the docs whenever you like."
        )

    def answer_after_tools(self, turn: int, results: list[Message]) -> Message:
        """The assistant's follow-up once its tool results are in."""
        names = ", ".join(result.name or "tool" for result in results)
        return Message.assistant(f"Done with {names} for turn {turn}; here is what I found.")


def run_tool(call: ToolCall) -> Message:
    """A fake tool: deterministic results, one of them deliberately large."""
    arguments: Any = (
        orjson.loads(call.arguments) if isinstance(call.arguments, str) else call.arguments
    )
    if call.name == "get_weather":
        city = arguments["city"]
        result: object = {"city": city, "celsius": 10 + len(city) * 2, "sky": "clear"}
    elif call.name == "search_docs":
        # A search returns pages of text: these are what pruning trims.
        result = {
            "query": arguments["query"],
            "hits": [
                {"title": f"{arguments['query']} part {n}", "text": "lorem ipsum dolor " * 60}
                for n in range(arguments["limit"])
            ],
        }
    else:
        result = {"value": eval_product(arguments["expression"])}
    return Message.tool(call.id, result, name=call.name)


def eval_product(expression: str) -> int:
    """``"a * b"`` -> a*b (the only arithmetic the fake calculator needs)."""
    left, right = (int(part) for part in expression.split("*"))
    return left * right


def demo_store_url() -> str:
    """The store the demo writes to when given none.

    ``$NOUS_SESSION_STORE`` when set, else ``sqlite:///nous_session_demo.sqlite3``: a file in
    the working directory, never one under the home directory that the user did not ask for.
    """
    return os.environ.get(STORE_ENV) or f"sqlite:///{DEMO_FILE}"


def _shown(url: str) -> str:
    """The store URL to print: a password in it masked."""
    return re.sub(r"(://[^:/@]+):[^@]*@", r"\1:***@", url)


def _where(url: str) -> str:
    """The store URL as a person reads it: a SQLite file with its absolute path."""
    if url.startswith("sqlite:///") and url != "sqlite:///:memory:":
        return f"{url} (the file {Path(url.removeprefix('sqlite:///')).resolve()})"
    return _shown(url)


def _line(event: Event) -> str | None:
    """How the live subscriber shows an event (None: not worth a line)."""
    if event.type is EventType.USER_MESSAGE:
        return f"  user       {_clip(event.data.get('content'))}"
    if event.type is EventType.ASSISTANT_MESSAGE:
        calls = event.data.get("tool_calls")
        if isinstance(calls, list) and calls:
            names = ", ".join(str(call["name"]) for call in calls if isinstance(call, dict))
            return f"  assistant  -> calls {names}"
        return f"  assistant  {_clip(event.data.get('content'))}"
    if event.type is EventType.TOOL_RESULT:
        return f"  tool       {event.data.get('name')}: {_clip(event.data.get('content'), 48)}"
    op = event.op
    if event.type is EventType.SYSTEM_MESSAGE and isinstance(op, Replace):
        if event.data.get("source") == "pruning":
            return f"  ~ pruned the tool result at position {op.start} in place (seq {event.seq})"
        return f"  ~ compacted positions {op.start}..{op.stop} into one summary (seq {event.seq})"
    return None


def _clip(value: object, width: int = 64) -> str:
    text = value if isinstance(value, str) else repr(value)
    text = text.replace("\n", " ")
    return text if len(text) <= width else text[: width - 1] + "…"


def _full_history_tokens(log: Log) -> int:
    """Tokens of every message ever appended, as if nothing had been compacted."""
    return estimate_messages_tokens(
        [
            to_message(event)
            for event in log.events()
            if event.is_surface and event.surface_op is None
        ]
    )


async def run_demo(
    *,
    store_url: str | None = None,
    session_id: str | None = None,
    turns: int = 300,
    token_budget: int = 6000,
    out: TextIO,
    every_turn: int = 25,
) -> dict[str, Any]:
    """Run the demo conversation; print as it goes; return the figures.

    Args:
        store_url: where to store the session; None is :func:`demo_store_url`
            (``$NOUS_SESSION_STORE``, else ``nous_session_demo.sqlite3`` in the working
            directory).
        session_id: the session to write; default ``demo-<UTC timestamp>``.
        turns: how many user turns to play.
        token_budget: the compaction budget (compaction triggers at 80% of it).
        out: where to print.
        every_turn: print the live stream for turn 1..3 and every this-many turns after.
    """
    say: Callable[[str], None] = lambda text: print(text, file=out, flush=True)  # noqa: E731
    session_id = session_id or datetime.now(UTC).strftime("demo-%Y%m%d-%H%M%S")
    url = store_url or demo_store_url()
    # Say where it goes before anything is written (opening a store writes nothing yet).
    say(f"nous_session demo: writing session {session_id!r} to {_where(url)}")
    store: Store = open_store(url)
    policy = CompactionPolicy(token_budget=token_budget, keep_last=24, prune_tool_results=600)
    model = FakeModel()
    shown_turn = [0]
    started = time.perf_counter()
    say(f"{turns} turns, compaction at 80% of {token_budget} tokens, keep_last=24\n")

    async def watch(session: SessionActor, task_status: Any = anyio.TASK_STATUS_IGNORED) -> None:
        async with session.subscribe(session.log.count) as events:
            task_status.started()
            async for event in events:
                if event.type is EventType.TURN_START:
                    turn = event.data.get("turn")
                    assert isinstance(turn, int)
                    shown_turn[0] = turn
                    if turn <= 3 or turn % every_turn == 0:
                        say(f"[turn {turn:3d}] seq {event.seq}")
                line = _line(event)
                visible = shown_turn[0] <= 3 or shown_turn[0] % every_turn == 0
                if line is not None and (visible or line.startswith("  ~")):
                    say(line)

    try:
        async with (
            anyio.create_task_group() as watchers,
            SessionActor.open(session_id=session_id, store=store, compaction=policy) as session,
        ):
            await watchers.start(watch, session)
            if session.log.count == 0:
                await session.add_message(
                    Message.system("You are a terse assistant with weather and docs tools.")
                )
            for turn in range(1, turns + 1):
                await session.append(EventType.TURN_START, {"turn": turn})
                await session.add_message(Message.user(f"Question {turn}: what's new?"))
                reply = model.reply(turn, len(session.messages()))
                await session.add_message(reply)
                if reply.tool_calls:
                    results = [run_tool(call) for call in reply.tool_calls]
                    await session.append_many(
                        [
                            (EventType.TOOL_CALL, {"id": call.id, "name": call.name})
                            for call in reply.tool_calls
                        ]
                    )
                    for result in results:
                        await session.add_message(result)
                    await session.add_message(model.answer_after_tools(turn, results))
                await session.append(EventType.TURN_END, {"turn": turn})
            # Let a compaction that is still running land before closing.
            with anyio.fail_after(30):
                await session.wait_for_compaction()
            before = session.log
            stats = session.statistics()
        elapsed = time.perf_counter() - started

        say("\nrestarting: reopening the session from the store ...")
        async with SessionActor.open(session_id=session_id, store=store) as reopened:
            after = reopened.log
            intact = (
                list(after.events()) == list(before.events())
                and list(after.derive_messages()) == list(before.derive_messages())
                and after.count == before.count
            )
        surface = after.derive_messages()
        figures = {
            "session_id": session_id,
            "store": _shown(url),
            "turns": turns,
            "events": len(after.events()),
            "count": after.count,
            "surface_messages": len(surface),
            "surface_roles": {
                role.value: sum(1 for m in surface if m.role is role) for role in Role
            },
            "tokens_full_history": _full_history_tokens(after),
            "tokens_surface": estimate_messages_tokens(surface),
            "compactions": stats.compactions_run,
            "stale": stats.compactions_stale,
            "failed": stats.compactions_failed,
            "batches": stats.batches,
            "intact_after_restart": intact,
            "seconds": round(elapsed, 2),
        }
    finally:
        await store.aclose()

    say(f"  full history intact after the restart: {'yes' if intact else 'NO'}")
    say(f"  events in the log:            {figures['events']}")
    say(f"  messages the model sees:      {figures['surface_messages']}")
    say(f"  tokens, full history:         {figures['tokens_full_history']}")
    say(f"  tokens, surface (compacted):  {figures['tokens_surface']}")
    say(
        f"  compactions applied:          {figures['compactions']} (stale {figures['stale']},"
        f" failed {figures['failed']})"
    )
    say(f"  commits (group-committed):    {figures['batches']}")
    say(f"  conversation time:            {figures['seconds']} s")
    store_flag = f" --store {_shown(url)}"
    python = _python()
    if str(url).startswith("memory:"):
        say("\n(the memory: store ended with this process; run on SQLite to look inside)")
        return figures
    say("\nlook inside what it stored:")
    for command in (
        "sessions",
        f"stats {session_id}",
        f"messages {session_id}",
        # A seq the session has, whatever --turns was (40 failed after a 3-turn demo).
        f"messages {session_id} --as-of {min(40, after.count - 1)}",
        f"events {session_id} --since {max(0, after.count - 10)}",
        f"export {session_id} > {session_id}.jsonl",
        f"tail {session_id}",
    ):
        say(f"  {python} -m nous_session{store_flag} {command}")
    return figures


def _python() -> str:
    """How to name this interpreter in a command to copy: relative when it is a project venv."""
    executable = Path(sys.executable)
    try:
        return str(executable.relative_to(Path.cwd()))
    except ValueError:
        return "python"
