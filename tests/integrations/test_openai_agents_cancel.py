"""openai-agents: a write cut short by an anyio cancel scope (a deadline, ``move_on_after``)
on each path ``add_items`` takes.

anyio cancels a task in a cancelled scope again at every await until the task leaves the
scope, unlike ``task.cancel()``, which cancels once. The SDK runs on asyncio only, so each
test runs ``asyncio.run`` in a thread of its own, given a time to end in: a caller that
spins for ever fails the test instead of holding the run.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any, TypeVar

import anyio
import pytest

from nous_session.integrations.openai_agents import NousSession

T = TypeVar("T")

KEPT: dict[str, Any] = {"role": "user", "content": "kept"}


def within(seconds: float, main: Callable[[], Awaitable[T]]) -> T:
    """``asyncio.run(main())`` in a daemon thread; fails if it has not ended in time."""
    out: list[T] = []
    errors: list[BaseException] = []

    def run() -> None:
        try:
            out.append(asyncio.run(main()))  # type: ignore[arg-type]  # a coroutine function
        except BaseException as error:
            errors.append(error)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    thread.join(seconds)
    assert not thread.is_alive(), f"still running after {seconds} s"
    if errors:
        raise errors[0]
    return out[0]


@pytest.fixture
def url(tmp_path: Path) -> str:
    return f"sqlite:///{tmp_path / 'agents.sqlite3'}"


@pytest.mark.parametrize("warm", [False, True], ids=["opening", "open"])
def test_an_add_in_a_cancelled_scope_lands_once_and_the_scope_catches_it(
    url: str, warm: bool
) -> None:
    """The fast path (the actor open, its queue empty) waited for the actor's answer by
    queueing reloads until one was not cancelled: in an anyio scope every one was, and the
    caller spun for ever, queueing reloads."""
    session = NousSession("scope", url)

    async def main() -> tuple[bool, list[Any]]:
        if warm:
            await session.get_items()  # the actor open and idle: add_items' fast path
        with anyio.CancelScope() as scope:
            scope.cancel()
            await session.add_items([KEPT])
        return scope.cancelled_caught, await session.get_items()

    try:
        assert within(20, main) == (True, [KEPT])
    finally:
        session.close()


def test_adds_under_short_deadlines_each_land_once_or_not_at_all(url: str) -> None:
    """Deadlines that fall at every point of the call: each add either returned (its item
    is there) or was cut short, and then its item is there once or not at all, in order."""
    session = NousSession("deadline", url)

    async def main() -> tuple[int, list[Any]]:
        await session.get_items()
        returned = 0
        for step in range(40):
            with anyio.move_on_after(step * 0.0002):
                await session.add_items([{"role": "user", "content": f"m{step}"}])
                returned += 1
        return returned, await session.get_items()

    try:
        returned, items = within(20, main)
    finally:
        session.close()
    numbers = [int(item["content"][1:]) for item in items]
    assert numbers == sorted(set(numbers))  # none twice, in order
    assert len(numbers) >= returned


def test_every_write_in_a_cancelled_scope_completes_before_the_scope_catches_it(url: str) -> None:
    """pop_item, clear_session and the compaction hook's replacement wait for their outcome
    in a scope cancelled before they start, on the actor's loop, and then raise."""
    session = NousSession("writes", url)

    async def main() -> list[Any]:
        await session.add_items([KEPT, {"role": "user", "content": "popped"}, KEPT])
        snapshot = await session._get_compaction_snapshot(1)
        assert snapshot is not None
        caught = []
        for write in (
            session.pop_item,
            lambda: snapshot.replace_suffix(0, [{"role": "user", "content": "summary"}]),
        ):
            with anyio.CancelScope() as scope:
                scope.cancel()
                await write()
            caught.append(scope.cancelled_caught)
        assert caught == [True, True]
        # The pop took the last KEPT; the snapshot then lost (its suffix changed).
        assert await session.get_items() == [KEPT, {"role": "user", "content": "popped"}]
        with anyio.CancelScope() as scope:
            scope.cancel()
            await session.clear_session()
        assert scope.cancelled_caught
        return await session.get_items()

    try:
        assert within(20, main) == []
    finally:
        session.close()
