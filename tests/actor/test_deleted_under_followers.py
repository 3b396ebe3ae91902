"""A session deleted anywhere closes every actor that follows it, promptly, through the change
feed (SQLite's ``data_version`` poll, PostgreSQL's NOTIFY): with no write of its own to hear
of it at, the actor closes with SessionDeletedError, its subscribers' streams end, and every
call from then on says the session was deleted. Each delete here is made by another process
(the CLI, or a worker that makes the session again), or through the actor's own store object.
A delete of another session closes nothing.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path

import anyio
import pytest

from nous_session import (
    Message,
    SessionActor,
    SessionClosedError,
    SessionDeletedError,
    Sessions,
    Subscription,
    open_store,
)
from tests.support.processes import shared_store_url

pytestmark = pytest.mark.anyio
WORKER = str(Path(__file__).parents[1] / "support" / "store_worker.py")
PROMPTLY = 10  # seconds: a follower that misses the delete fails the test, never hangs it


@pytest.fixture(params=["sqlite", "postgres", "pgbouncer"])
def url(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    """A store URL every process reaches: a SQLite file, a PostgreSQL schema of the test's
    own (dropped after it), and the same through PgBouncer in transaction pooling mode (the
    delete's transaction goes through it; the listener connects directly)."""
    yield from shared_store_url(request.param, tmp_path, "deleted")


async def _in_another_process(*arguments: str) -> None:
    """Run ``python ARGUMENTS`` (another holder of the store) to its end: it must succeed."""
    await anyio.run_process([sys.executable, *arguments])


async def _delete_elsewhere(url: str, session_id: str) -> None:
    """Delete the session from another process: the CLI's ``nous-session delete``."""
    await _in_another_process("-m", "nous_session", "--store", url, "delete", "--yes", session_id)


async def _ends_empty(events: Subscription) -> None:
    """Wait until the subscription ends (its actor closed), failing on any event it streams
    (the actor's session is gone: nothing more is its) or if it has not ended in time."""
    with anyio.fail_after(PROMPTLY):
        async for event in events:
            pytest.fail(f"streamed event {event.seq} of a session that was deleted")


async def _closed_as_deleted(session: SessionActor) -> None:
    """The actor has closed because its session was deleted: a call says so, and stores
    nothing."""
    assert session.closed
    with pytest.raises(SessionClosedError, match=f"'{session.session_id}' was deleted") as raised:
        await session.add_message(Message.user("after the delete"))
    assert isinstance(raised.value.__cause__, SessionDeletedError)


def _contents(events: object) -> list[str]:
    return [event.data["content"] for event in events]  # type: ignore[attr-defined]


@pytest.mark.parametrize("deleter", ["another process", "its own store"])
async def test_a_following_actor_closes_when_its_session_is_deleted(url: str, deleter: str) -> None:
    """Another process (or a direct call on the store the actor uses: SQLite's solo mode,
    where the feed reads nothing but its own writer's notes) deletes the session while its
    actor waits: the actor closes without writing anything."""
    async with open_store(url) as store:
        async with SessionActor.open(session_id="gone", store=store, follow=True) as session:
            await session.add_message(Message.user("one"))
            await session.add_message(Message.user("two"))
            batches = session.statistics().batches
            async with session.subscribe(since=2) as events:
                if deleter == "another process":
                    await _delete_elsewhere(url, "gone")
                else:
                    assert await store.delete("gone")
                await _ends_empty(events)
            assert session.statistics().batches == batches  # it wrote nothing
            assert [m.text for m in session.messages()] == ["one", "two"]
            await _closed_as_deleted(session)
        assert await store.load("gone") == []  # nothing was stored after the delete


async def test_a_registry_session_closes_when_another_process_deletes_it(url: str) -> None:
    """A ``Sessions`` registry's session (following by default: the store has a change feed)
    closes the same way, and the registry's next use of the id opens a new actor, which
    starts the session anew."""
    async with Sessions(url) as sessions:
        async with sessions.use("gone") as session:
            await session.add_message(Message.user("one"))
            async with session.subscribe(since=1) as events:
                await _delete_elsewhere(url, "gone")
                await _ends_empty(events)
            await _closed_as_deleted(session)
        async with sessions.use("gone") as fresh:
            assert fresh is not session
            assert (await fresh.add_message(Message.user("anew"))).seq == 0
    async with open_store(url) as store:
        assert _contents(await store.load("gone")) == ["anew"]


@pytest.mark.parametrize("made_by", ["another actor", "the follower"])
@pytest.mark.parametrize("remade", [1, 3])
async def test_a_following_actor_closes_when_its_session_is_deleted_and_made_again(
    url: str, made_by: str, remade: int
) -> None:
    """Another process deletes the session and makes it again with as many events as the
    actor has seen, or more: the actor closes (the feed brings the delete, or the new
    session's head or identity, and its read finds another session) and streams none of the
    new session's events. Whether it opened a session that existed or made it itself (its
    first commit told it the session's identity)."""
    if made_by == "another actor":
        async with SessionActor.open(session_id="gone", store=url) as first:
            await first.add_message(Message.user("old 0"))
    async with SessionActor.open(session_id="gone", store=url, follow=True) as session:
        if made_by == "the follower":
            await session.add_message(Message.user("old 0"))
        async with session.subscribe(since=1) as events:
            await _in_another_process(WORKER, "remake", url, "gone", str(remade))
            await _ends_empty(events)
        assert [m.text for m in session.messages()] == ["old 0"]
        await _closed_as_deleted(session)
    async with open_store(url) as store:
        assert _contents(await store.load("gone")) == [f"new {n}" for n in range(remade)]


async def test_a_delete_of_another_session_closes_nothing(url: str) -> None:
    """Another process deletes another session of the same store, then appends to the
    followed one: the follower streams that append (the feed has read past the delete) and
    is still open."""
    async with SessionActor.open(session_id="other", store=url) as other:
        await other.add_message(Message.user("theirs"))
    async with SessionActor.open(session_id="kept", store=url, follow=True) as session:
        await session.add_message(Message.user("mine"))
        async with session.subscribe(since=1) as events:
            await _delete_elsewhere(url, "other")
            await _in_another_process(WORKER, "write", url, "kept", "w", "1", "1")
            with anyio.fail_after(PROMPTLY):
                async for event in events:
                    assert (event.seq, event.data["content"]) == (1, "w 0 0")
                    break
        assert not session.closed
        assert (await session.add_message(Message.user("mine again"))).seq == 2
    async with open_store(url) as store:
        assert await store.load("other") == []
        assert _contents(await store.load("kept")) == ["mine", "w 0 0", "mine again"]
