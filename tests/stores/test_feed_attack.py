"""Attacks on the SQLite change feed's solo mode and the follower's lazily started task:
orderings and writers that the solo-mode argument (stores/sqlite/_feed.py) must survive."""

from __future__ import annotations

from contextlib import aclosing
from pathlib import Path

import anyio
import pytest

from nous_session import Encryption, LocalKeyFile, Message, SessionActor, StoreError
from nous_session.event import Event, make_event
from nous_session.stores.sqlite import SQLiteStore

pytestmark = pytest.mark.anyio

USER = "user_message"


def _event(seq: int, text: str = "x") -> Event:
    return make_event(seq, USER, {"content": text})


async def _until(actor: SessionActor, count: int) -> None:
    """Wait (at most 10 s: a follower that misses a commit fails, never hangs) until the
    actor's log holds ``count`` events."""
    with anyio.fail_after(10):
        async with actor.subscribe(0) as events:
            async for event in events:
                if event.seq + 1 >= count:
                    return


class _Outage:
    """A key provider whose wrap fails while ``down`` (a KMS outage)."""

    def __init__(self, provider: LocalKeyFile) -> None:
        self._provider = provider
        self.name = provider.name
        self.down = False

    def wrap(self, key: bytes) -> bytes:
        if self.down:
            raise ConnectionError("the KMS is down")
        return self._provider.wrap(key)

    def unwrap(self, wrapped: bytes) -> bytes:
        return self._provider.unwrap(wrapped)


async def test_a_failed_erasure_leaves_no_head_of_its_own_for_the_feed(tmp_path: Path) -> None:
    # An erasure runs on the writer's thread outside its write groups; one that fails after
    # appending its erasure event (the provider could not wrap the new data key) is rolled
    # back, but what the triggers noted must not reach the feed as a head: it would be pushed
    # (a count the session does not have), and the commit that really makes that count would
    # then look like one the feed had seen already, and reach no watch.
    provider = _Outage(LocalKeyFile.create(tmp_path / "master.key"))
    async with (
        SQLiteStore(tmp_path / "s.db", encryption=Encryption(provider)) as store,
        aclosing(store.watch("s")) as heads,
        aclosing(store.watch("m")) as marks,
    ):
        with anyio.fail_after(10):
            await store.commit("s", expected_count=0, events=(_event(0), _event(1)))
            assert await anext(marks) == 0
            while await anext(heads) != 2:
                pass
            provider.down = True
            with pytest.raises(StoreError, match="could not wrap"):
                await store.erase("s", [0], reason="test")
            provider.down = False
            await store.commit("t", expected_count=0, events=(_event(0),))  # a write group
            # A mark: once its head is pushed, whatever the feed took before it is pushed too.
            await store.commit("m", expected_count=0, events=(_event(0),))
            assert await anext(marks) == 1
            monitor = store._monitor
            assert monitor is not None
            assert monitor._solo
            assert [watch.heads for watch in monitor._watches["s"]] == [[]], "no head moved"
            await store.commit("s", expected_count=2, events=(_event(2),))
            assert await anext(heads) == 3


# A store opened through a symbolic link to its file: SQLite resolves the link, and makes its
# -wal and -shm files next to the file the link names, not next to the link.


async def _follow_through(link: Path, real: Path, read_only: bool) -> None:
    async with SQLiteStore(real) as other:
        await other.commit("s", expected_count=0, events=(_event(0),))
        async with (
            SQLiteStore(link, read_only=read_only) as store,
            SessionActor.open(session_id="s", store=store) as follower,
            SessionActor.open(session_id="s", store=other, follow=False) as writer,
        ):
            assert follower.log.count == 1
            await writer.add_message(Message.user("1"))
            await _until(follower, 2)
            assert [m.text for m in follower.messages()] == ["x", "1"]


async def test_a_store_opened_through_a_symlink_follows_another_writer(tmp_path: Path) -> None:
    (tmp_path / "link.db").symlink_to(tmp_path / "s.db")
    await _follow_through(tmp_path / "link.db", tmp_path / "s.db", read_only=False)


async def test_a_read_only_store_opened_through_a_symlink_follows_a_writer(
    tmp_path: Path,
) -> None:
    (tmp_path / "link.db").symlink_to(tmp_path / "s.db")
    await _follow_through(tmp_path / "link.db", tmp_path / "s.db", read_only=True)


async def test_solo_mode_holds_through_a_symlink(tmp_path: Path) -> None:
    # The writer's account peeks at the -shm file SQLite uses: through the link, that is the
    # one next to the file, so a store that is its file's only writer stays in solo mode.
    (tmp_path / "link.db").symlink_to(tmp_path / "s.db")
    async with (
        SQLiteStore(tmp_path / "link.db") as store,
        SessionActor.open(session_id="s", store=store) as actor,
    ):
        await actor.add_message(Message.user("0"))
        await store.sessions()  # a read: the writer has told its account of that commit
        assert store._own is not None
        assert store._own.armed
        assert not store._own.shared
