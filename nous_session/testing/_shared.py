"""What every part of the conformance suite uses: sample events and logs, odd session ids, and a
second store object over the same data."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from datetime import UTC, datetime, timedelta
from typing import TypeVar

import pytest

from nous_session.event import Event, make_event
from nous_session.log import Log
from nous_session.message import Message, ToolCall
from nous_session.stores.base import ForkingStore, RebasingStore, Store, supports

_T = TypeVar("_T")

__all__ = [
    "ODD_SESSION_IDS",
    "T0",
    "Capabilities",
    "reopened",
    "sample_log",
    "stored_sample",
    "user_event",
]

T0 = datetime(2026, 1, 1, 12, 0, 0, 123456, tzinfo=UTC)

ODD_SESSION_IDS = (
    "plain",
    'it\'s "quoted"',
    "x'); DROP TABLE nous_events; --",
    "ünïcødé 🚀",
    "a" * 256,  # the longest id every store takes (MAX_SESSION_ID_BYTES)
    "ü" * 128,  # as long, in two-byte characters
    "with\nnewline and\ttab",
)


class Capabilities:
    """The fixtures of the store under test as an optional capability, checked as the engine
    checks it (:func:`~nous_session.stores.base.supports`): a test that asks for one is
    skipped on a store without it."""

    @pytest.fixture
    def forking(self, store: Store) -> ForkingStore:
        """The store under test, as a ForkingStore."""
        return _capable(store, ForkingStore, "cannot fork")

    @pytest.fixture
    def rebasing(self, store: Store) -> RebasingStore:
        """The store under test, as a RebasingStore."""
        return _capable(store, RebasingStore, "has no commit_rebased")


def _capable(store: Store, capability: Callable[..., _T], missing: str) -> _T:
    if not supports(store, capability):
        pytest.skip(f"{type(store).__name__} {missing}")
    return store


def sample_log(size: int = 12, *, start: datetime = T0) -> Log:
    """A log with every kind of event: messages, tool pairs, bookkeeping, a replace."""
    log = Log()
    for index in range(size):
        time = start + timedelta(seconds=index, microseconds=index)
        kind = index % 6
        if kind == 0:
            log = log.append("user_message", {"content": f"question {index} ✓"}, time=time)
        elif kind == 1:
            log = log.append("turn_start", {"turn": index}, time=time)
        elif kind == 2:
            call = ToolCall(f"call_{index}", "lookup", {"q": index, "deep": {"x": [1, 2.5, None]}})
            log = log.append(
                "assistant_message",
                Message.assistant("checking", tool_calls=[call]).to_json(),
                time=time,
            )
        elif kind == 3:
            log = log.append(
                "tool_result",
                Message.tool(f"call_{index - 1}", {"ok": True}, name="lookup").to_json(),
                time=time,
            )
        elif kind == 4:
            log = log.append(
                "assistant_message",
                {
                    "content": [{"type": "text", "text": f"answer {index}"}],
                    "reasoning_content": "r",
                },
                time=time,
            )
        else:
            log = log.append(
                "system_message",
                {"content": f"summary up to {index - 2}", "surface_op": ["replace", 0, index - 2]},
                time=time,
            )
    return log


async def stored_sample(store: Store, session_id: str, size: int = 12) -> Log:
    """``sample_log(size)`` committed whole as ``session_id``'s first commit; the log is
    returned, to compare with what the store gives back."""
    log = sample_log(size)
    await store.commit(session_id, expected_count=0, events=log.events())
    return log


def user_event(seq: int, content: str) -> Event:
    return make_event(seq, "user_message", {"content": content}, T0 + timedelta(seconds=seq))


@asynccontextmanager
async def reopened(store: Store, reopen: Callable[[], Store]) -> AsyncIterator[Store]:
    """A second store object over ``store``'s data (``reopen()``), closed when the block ends
    unless it is ``store`` itself (an in-memory store's ``reopen`` gives the same object)."""
    again = reopen()
    try:
        yield again
    finally:
        if again is not store:
            await again.aclose()
