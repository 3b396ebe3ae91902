"""Retention's bad input and outcomes on every built-in store: an argument it cannot use is
refused before anything is done, and a run that fails midway says what it did."""

from __future__ import annotations

import os
import uuid
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any, Literal

import anyio
import pytest

from nous_session import Message, SessionActor
from nous_session.errors import StoreError
from nous_session.retention import apply, parse_duration
from nous_session.stores import Store, open_store
from tests.support.processes import Lines, ending, spawn_worker

POSTGRES_URL = os.environ.get("NOUS_SESSION_TEST_POSTGRES")

pytestmark = pytest.mark.anyio

LATER = datetime.now(UTC) + timedelta(days=100)


async def _sessions(store: Store, *names: str) -> None:
    for name in names:
        async with SessionActor.open(session_id=name, store=store) as session:
            await session.add_message(Message.user(f"{name} says hi"))


async def _names(store: Store) -> list[str]:
    return sorted(info.session_id for info in await store.sessions())


def test_a_duration_too_long_for_a_timedelta_is_named() -> None:
    # Past what a timedelta holds: an OverflowError from inside datetime, before.
    for text in ("1000000000d", "99999999999d", "999999999w", "9" * 30 + "s"):
        with pytest.raises(ValueError, match=f"duration.*{text}"):
            parse_duration(text)


@pytest.mark.parametrize(
    "policy",
    [
        {"idle_for": "99999999999d"},
        {"older_than": "3000000d"},  # a timedelta, but the cut-off is before year 1
        {"idle_for": timedelta.max},
        {"idle_for": "1d", "now": datetime(1, 1, 1, 12, tzinfo=UTC)},
    ],
    ids=["past-a-timedelta", "before-year-1", "timedelta-max", "now-near-year-1"],
)
async def test_a_cut_off_out_of_the_calendar_is_refused_naming_it(
    any_store: Store, policy: dict[str, Any]
) -> None:
    await _sessions(any_store, "a")
    for dry_run in (True, False):
        with pytest.raises(
            ValueError, match=f"^{'idle_for' if 'idle_for' in policy else 'older_than'}"
        ):
            await apply(any_store, dry_run=dry_run, **policy)
    assert await _names(any_store) == ["a"]


@pytest.mark.parametrize("progress", [5, "bar"])
async def test_a_progress_that_cannot_be_called_is_refused_before_anything_is_done(
    any_store: Store, progress: object
) -> None:
    await _sessions(any_store, "a", "b")
    with pytest.raises(ValueError, match="progress"):
        await apply(any_store, idle_for="90d", now=LATER, dry_run=False, progress=progress)  # type: ignore[arg-type]  # the bad input under test
    assert await _names(any_store) == ["a", "b"]


async def test_a_plain_progress_function_may_return_a_value(any_store: Store) -> None:
    # A plain function is called for its effect: what it returns (tqdm's update, a list's
    # count) is not awaited, and every selected session is done.
    await _sessions(any_store, "a", "b", "c")
    seen: list[int] = []

    def progress(done: int, total: int) -> int:
        seen.append(done)
        return done

    report = await apply(any_store, idle_for="90d", now=LATER, dry_run=False, progress=progress)
    assert (report.done, report.kept, seen) == (3, 0, [1, 2, 3])
    assert await _names(any_store) == []


@pytest.mark.parametrize("action", ["delete", "snapshot"])
async def test_a_run_that_fails_midway_says_what_it_did_and_a_second_run_finishes(
    any_store: Store, action: Literal["delete", "snapshot"], monkeypatch: pytest.MonkeyPatch
) -> None:
    for name in ("a", "b", "c"):
        async with SessionActor.open(session_id=name, store=any_store) as session:
            await session.add_message(Message.user(f"{name} 1"))
            await session.add_message(Message.user(f"{name} 2"))
            await session.replace(0, 1, Message.system(f"{name} summary"))
    calls = 0
    real = any_store.delete_idle if action == "delete" else any_store.commit

    async def failing(*args: Any, **kwargs: Any) -> Any:
        nonlocal calls
        calls += 1
        if calls == 2:
            raise StoreError("the disk is full")
        return await real(*args, **kwargs)

    monkeypatch.setattr(any_store, "delete_idle" if action == "delete" else "commit", failing)
    with pytest.raises(StoreError, match="the disk is full") as caught:
        await apply(any_store, idle_for="90d", now=LATER, action=action, dry_run=False)
    done = "deleted" if action == "delete" else "snapshotted"
    assert caught.value.__notes__ == [
        f"retention stopped with 1 of the 3 selected sessions handled: it had {done} 1 and"
        " kept 0; a second run does the rest"
    ]
    monkeypatch.undo()
    report = await apply(any_store, idle_for="90d", now=LATER, action=action, dry_run=False)
    if action == "delete":
        assert (report.done, len(report.selected)) == (2, 2)
        assert await _names(any_store) == []
    else:
        assert (report.done, report.dropped_events) == (3, 4)  # "a" had nothing left to drop


async def test_a_run_cancelled_midway_says_what_it_did(any_store: Store) -> None:
    await _sessions(any_store, "a", "b", "c")
    with anyio.CancelScope() as scope:

        async def cancel(done: int, total: int) -> None:
            if done == 2:
                scope.cancel()
                await anyio.lowlevel.checkpoint()

        try:
            await apply(any_store, idle_for="90d", now=LATER, dry_run=False, progress=cancel)
        except anyio.get_cancelled_exc_class() as cancelled:
            notes = cancelled.__notes__
            raise
    assert scope.cancelled_caught
    assert notes == [
        "retention stopped with 2 of the 3 selected sessions handled: it had deleted 2 and"
        " kept 0; a second run does the rest"
    ]
    assert await _names(any_store) == ["c"]
    report = await apply(any_store, idle_for="90d", now=LATER, dry_run=False)
    assert (report.done, await _names(any_store)) == (1, [])


# Beside a writer in another process ----------------------------------------------------------


@pytest.fixture(params=["sqlite", "postgres"])
async def shared(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[str]:
    """The URL of a store another process can open too."""
    if request.param == "sqlite":
        yield f"sqlite:///{tmp_path / 'shared.sqlite3'}"
        return
    if not POSTGRES_URL:
        pytest.skip("no PostgreSQL server: set NOUS_SESSION_TEST_POSTGRES=postgresql://...")
    import psycopg

    schema = f"t_{uuid.uuid4().hex[:16]}"
    yield f"{POSTGRES_URL}{'&' if '?' in POSTGRES_URL else '?'}schema={schema}"
    with psycopg.connect(POSTGRES_URL, autocommit=True) as connection:
        connection.execute(f"DROP SCHEMA IF EXISTS {schema} CASCADE")


@pytest.mark.parametrize("action", ["delete", "snapshot"])
async def test_a_session_another_process_writes_to_during_the_run_is_kept(
    shared: str, action: Literal["delete", "snapshot"], monkeypatch: pytest.MonkeyPatch
) -> None:
    # "busy" is selected (the policy's clock is 100 days on), then, before retention acts on
    # it, a writer in another process commits to it: the delete (or the snapshot's commit)
    # must find the count moved and keep it, and the writer goes on as if nothing happened.
    store = open_store(shared)
    try:
        for name in ("busy", "idle"):
            async with SessionActor.open(session_id=name, store=store) as session:
                await session.add_message(Message.user(f"{name} 1"))
                await session.add_message(Message.user(f"{name} 2"))
                await session.replace(0, 1, Message.system(f"{name} summary"))
        writer = spawn_worker("write", shared, "busy", "w", "1", "100000")
        with writer as child, ending(child):
            lines = Lines(child)
            assert await anyio.to_thread.run_sync(lines.next) == "ready\n"
            acked: list[int] = []

            async def after_a_commit_past(count: int) -> None:
                """Until the writer has acknowledged a commit past ``count`` events."""
                while not acked or acked[-1] < count:
                    line = await anyio.to_thread.run_sync(lines.next)
                    assert line.startswith("ack "), line
                    acked.append(int(line.split()[1]))

            name = "delete_idle" if action == "delete" else "commit"
            real = getattr(store, name)

            async def racing(session_id: str, **kwargs: Any) -> Any:
                if session_id == "busy":
                    await after_a_commit_past(
                        kwargs["count"] if action == "delete" else kwargs["expected_count"]
                    )
                return await real(session_id, **kwargs)

            monkeypatch.setattr(store, name, racing)
            report = await apply(store, idle_for="90d", now=LATER, action=action, dry_run=False)
            monkeypatch.undo()
            assert [entry.session_id for entry in report.selected] == ["busy", "idle"]
            assert (report.done, report.kept) == (1, 1)
            await after_a_commit_past(max(acked, default=0) + 5)  # the writer goes on
        busy = await store.read("busy")
        assert busy.horizon == 0  # neither deleted nor snapshotted: every event still held
        assert [event.seq for event in busy.events] == list(range(busy.count))
        assert set(acked) <= {event.seq for event in busy.events}
        idle = await store.read("idle")
        assert idle.count == (0 if action == "delete" else 3)
        assert idle.horizon == (0 if action == "delete" else 3)
    finally:
        await store.aclose()
