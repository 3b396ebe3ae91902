"""Copying sessions between stores keeps them as they are: events, horizon, idempotency keys
with their kept events, erasures, metadata, and forks as forks when their parent comes too."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import anyio
import anyio.lowlevel
import attrs
import pytest

from nous_session import Message, SessionActor, SessionMetadata
from nous_session.encryption import Encryption, LocalKeyFile
from nous_session.errors import StoreError
from nous_session.stores import CopyError, CopyReport, MemoryStore, Stored, copy_sessions
from nous_session.stores.base import ListingStore, Store, supports
from nous_session.stores.sqlite import SQLiteStore
from tests.support.erasure import Backend, make_backend

pytestmark = pytest.mark.anyio

PAIRS = [
    ("memory", "sqlite"),
    ("sqlite", "memory"),
    ("sqlite", "postgres"),
    ("postgres", "sqlite"),
    ("postgres", "postgres"),
]


@pytest.fixture(params=PAIRS, ids=[f"{a}-to-{b}" for a, b in PAIRS])
def pair(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[tuple[Backend, Backend]]:
    source_kind, target_kind = request.param
    (tmp_path / "source").mkdir()
    (tmp_path / "target").mkdir()
    sources = make_backend(source_kind, tmp_path / "source")
    targets = make_backend(target_kind, tmp_path / "target")
    source = next(sources)
    target = next(targets)
    yield source, target
    for rest in (sources, targets):
        for _ in rest:  # the backends' own clean-up
            pass


@pytest.fixture
async def stores(pair: tuple[Backend, Backend]) -> AsyncIterator[tuple[Store, Store]]:
    source, target = pair[0].make(), pair[1].make()
    yield source, target
    await source.aclose()
    await target.aclose()


async def _fill(store: Store) -> None:
    """A session with metadata, keys, a summary, an erasure and a snapshot that keeps a key's
    events aside; a fork taken before the snapshot (which then holds what its parent
    dropped), one after it, a fork of that fork, and a plain session."""
    async with SessionActor.open(session_id="a", store=store) as actor:
        await actor.set_metadata(SessionMetadata(owner="ann", title="trip"))
        await actor.add_message(Message.user("first, with a key"), key="k0")
        await actor.add_message(Message.assistant("an answer"))
        await actor.add_message(Message.user("a secret"))
        await actor.fork("a-early")
        surface = actor.log.surface()
        await actor.replace(
            surface[0].position, surface[-1].position, [Message.assistant("summary")]
        )
        await actor.snapshot()
        added = await actor.add_message(Message.user("after the snapshot"), key="k1")
        await actor.erase([added.seq], reason="asked")
        await actor.add_message(Message.assistant("more"))
        await actor.fork("a-late")
    async with SessionActor.open(session_id="a-late", store=store) as actor:
        await actor.add_message(Message.user("in the fork"), key="k2")
        await actor.fork("a-late-child")
    async with SessionActor.open(session_id="a-late-child", store=store) as actor:
        await actor.add_message(Message.user("in the fork's fork"))
    async with SessionActor.open(session_id="b", store=store) as actor:
        await actor.add_message(Message.user("another"))


async def test_every_session_comes_as_it_is(stores: tuple[Store, Store]) -> None:
    source, target = stores
    await _fill(source)
    held = await source.read("a")
    assert held.kept  # the snapshot kept k0's events aside
    assert held.horizon
    report = await copy_sessions(source, target)
    assert sorted(report.copied) == ["a", "a-early", "a-late", "a-late-child", "b"]
    assert report.copied.index("a") < report.copied.index("a-late")
    assert report.copied.index("a-late") < report.copied.index("a-late-child")
    assert set(report.forked) == {"a-late", "a-late-child"}
    # The early fork took what its parent's snapshot dropped since: a whole session now.
    assert [name for name, _ in report.unlinked] == ["a-early"]
    assert "no longer holds" in report.unlinked[0][1]
    assert report.skipped == ()
    for name in report.copied:  # copy_sessions compared them too: this is the test's own look
        await _same(source, target, name)
    assert (await target.read("a-late-child")).parent == "a-late"
    assert (await target.read("a-early")).parent is None
    if supports(target, ListingStore):
        page = await target.list_sessions(where={"owner": "ann"})
        assert {entry.session_id for entry in page.sessions} >= {"a", "a-late"}
    # A retry in the target of a call made before the copy appends nothing, even for a key
    # whose events the snapshot dropped (kept aside).
    async with SessionActor.open(session_id="a", store=target) as actor:
        count = actor.log.count
        again = await actor.add_message(Message.user("first, with a key"), key="k0")
        assert again.seq == (await source.read("a")).keys["k0"][0]
        await actor.add_message(Message.user("after the snapshot"), key="k1")
        assert actor.log.count == count


async def test_a_second_copy_skips_what_the_target_holds(stores: tuple[Store, Store]) -> None:
    source, target = stores
    await _fill(source)
    await copy_sessions(source, target, ["b", "a"])
    # Run again with more (as after an interruption): what is there is skipped, and a fork
    # whose parent came the first time is still made a fork of it.
    report = await copy_sessions(source, target, ["b", "a", "a-late"])
    assert report.copied == ("a-late",)
    assert report.forked == ("a-late",)
    assert report.skipped == (
        ("b", "the target holds a session of that id"),
        ("a", "the target holds a session of that id"),
    )


async def test_a_fork_whose_parent_is_not_copied_comes_whole(stores: tuple[Store, Store]) -> None:
    source, target = stores
    await _fill(source)
    report = await copy_sessions(source, target, ["a-late-child"])
    assert report.copied == ("a-late-child",)
    assert report.unlinked == (("a-late-child", "its parent 'a-late' is not in the target"),)
    back = await target.read("a-late-child")
    assert back.parent is None
    assert list(back.events) == list((await source.read("a-late-child")).events)


async def test_a_session_the_source_lacks_is_refused_before_anything_is_copied() -> None:
    source, target = MemoryStore(), MemoryStore()
    async with SessionActor.open(session_id="here", store=source) as actor:
        await actor.add_message(Message.user("hi"))
    with pytest.raises(ValueError, match="no such session in the source: 'gone'"):
        await copy_sessions(source, target, ["here", "gone"])
    assert await target.sessions() == []


def test_the_report_is_a_value() -> None:
    assert CopyReport() == CopyReport((), (), (), ())


class _Forgetful(MemoryStore):
    """A store that loses idempotency keys: what copy_sessions must notice."""

    async def read(self, session_id: str, *, since: int = 0) -> Stored:
        stored = await super().read(session_id, since=since)
        return attrs.evolve(stored, keys={})


async def test_a_copy_that_does_not_read_back_stops_with_what_differs() -> None:
    source, target = MemoryStore(), _Forgetful()
    async with SessionActor.open(session_id="keyed", store=source) as actor:
        await actor.add_message(Message.user("hi"), key="k")
    with pytest.raises(CopyError, match=r"session 'keyed' does not read back .* \(keys differ\)"):
        await copy_sessions(source, target)
    assert (await target.read("keyed")).count == 0  # not left for a second run to skip


class _FailsToDrop(MemoryStore):
    """A store whose first commit that drops events fails: a copy stopped half way."""

    failed = False

    async def commit(self, session_id: str, **arguments: Any) -> str | None:
        if arguments.get("dropped") and not self.failed:
            self.failed = True
            raise StoreError("the disk is full")
        return await super().commit(session_id, **arguments)


async def test_a_session_whose_copy_fails_half_way_is_not_left_half_written() -> None:
    source, target = MemoryStore(), _FailsToDrop()
    await _fill(source)
    with pytest.raises(StoreError, match="the disk is full"):
        await copy_sessions(source, target, ["b", "a"])
    assert [info.session_id for info in await target.sessions()] == ["b"]
    report = await copy_sessions(source, target)  # again: what is there is skipped
    assert report.skipped == (("b", "the target holds a session of that id"),)
    assert (await target.read("a")).kept == (await source.read("a")).kept


async def test_a_fork_is_not_linked_to_a_later_session_of_its_parents_name(
    stores: tuple[Store, Store],
) -> None:
    # The fork's parent was deleted and a new session made under its name, holding the very
    # same events: the fork took nothing from that one, so its copy must not share its rows
    # (an erasure there would reach it).
    source, target = stores
    when = datetime(2026, 1, 1, tzinfo=UTC)
    async with SessionActor.open(session_id="p", store=source) as actor:
        await actor.append("x.app.note", {"n": 1}, time=when)
        await actor.fork("f")
    await source.delete("p")
    async with SessionActor.open(session_id="p", store=source) as actor:
        await actor.append("x.app.note", {"n": 1}, time=when)
    assert (await source.read("f")).parent == "p"  # the name is all the source says
    report = await copy_sessions(source, target)
    assert report.copied == ("p", "f")
    assert report.forked == ()
    assert report.unlinked == (("f", "its parent 'p' is another session by now"),)
    back = await target.read("f")
    assert back.parent is None
    assert list(back.events) == list((await source.read("f")).events)


async def test_encrypted_stores_copy_crypto_erased_sessions_as_they_are(tmp_path: Path) -> None:
    source = SQLiteStore(
        tmp_path / "source.sqlite3",
        encryption=Encryption(LocalKeyFile.create(tmp_path / "source.key")),
    )
    target = SQLiteStore(
        tmp_path / "target.sqlite3",
        encryption=Encryption(LocalKeyFile.create(tmp_path / "target.key")),
    )
    async with source, target:
        async with SessionActor.open(session_id="a", store=source) as actor:
            await actor.add_message(Message.user("first"), key="k")
            secret = await actor.add_message(Message.user("a secret"))
            await actor.fork("f")
            await actor.snapshot()
        async with SessionActor.open(session_id="f", store=source) as actor:
            await actor.add_message(Message.user("the fork's own"))
        await source.erase("a", [secret.seq], reason="asked")
        await source.erase_session("f", reason="asked", inherited=True)
        report = await copy_sessions(source, target)
        assert report.copied == ("a", "f")
        for name in report.copied:
            await _same(source, target, name)
        assert "a secret" not in repr([e.data for e in (await target.read("a")).events])


async def test_a_session_of_custom_events_only_comes_as_it_is(
    stores: tuple[Store, Store],
) -> None:
    source, target = stores
    async with SessionActor.open(session_id="x", store=source) as actor:
        await actor.append("x.app.one", {"v": 1}, key="k")
        await actor.append("x.app.two", {"v": 2})
    assert (await copy_sessions(source, target)).copied == ("x",)
    await _same(source, target, "x")


async def _chain(store: Store) -> None:
    """a, forked into b, into c, into d: each adds one message."""
    for name, child in (("a", "b"), ("b", "c"), ("c", "d"), ("d", None)):
        async with SessionActor.open(session_id=name, store=store) as actor:
            await actor.add_message(Message.user(name), key=f"k-{name}")
            if child is not None:
                await actor.fork(child)


async def test_a_chain_of_forks_whose_middle_is_deleted(stores: tuple[Store, Store]) -> None:
    source, target = stores
    await _chain(source)
    await source.delete("b")
    report = await copy_sessions(source, target, ["d", "c", "a", "d"])
    assert report.copied == tuple(sorted(report.copied, key="acd".index))
    for name in ("a", "c", "d"):
        await _same(source, target, name)
    assert (await target.read("d")).parent == "c"


async def test_a_chain_of_forks_whose_middle_is_snapshotted(stores: tuple[Store, Store]) -> None:
    source, target = stores
    await _chain(source)
    async with SessionActor.open(session_id="b", store=source) as actor:
        surface = actor.log.surface()
        await actor.replace(
            surface[0].position, surface[-1].position, [Message.assistant("summary")]
        )
        await actor.snapshot()
    report = await copy_sessions(source, target)
    assert set(report.copied) == {"a", "b", "c", "d"}
    for name in report.copied:
        await _same(source, target, name)
    assert (await target.read("d")).parent == "c"


async def test_forks_chosen_in_any_order_and_twice_come_after_their_parent() -> None:
    source, target = MemoryStore(), MemoryStore()
    await _chain(source)
    report = await copy_sessions(source, target, ["d", "b", "d", "a", "c", "b"])
    assert report.copied == ("a", "b", "c", "d")
    assert report.forked == ("b", "c", "d")


async def test_a_fork_copied_before_its_parent_stays_whole() -> None:
    source, target = MemoryStore(), MemoryStore()
    await _chain(source)
    assert (await copy_sessions(source, target, ["b"])).unlinked
    report = await copy_sessions(source, target, ["a", "b", "c"])
    assert report.copied == ("a", "c")
    assert report.skipped == (("b", "the target holds a session of that id"),)
    assert report.forked == ("c",)  # a fork of the whole copy of b, which holds what c took
    assert (await target.read("b")).parent is None


class _CancelledAfter(MemoryStore):
    """A store whose ``fail_on``-th write lands and then sees the copy cancelled."""

    fail_on = 0
    writes = 0
    scope: anyio.CancelScope | None = None

    async def _landed(self) -> None:
        self.writes += 1
        if self.writes == self.fail_on and self.scope is not None:
            self.scope.cancel()
            await anyio.lowlevel.checkpoint()  # the cancellation lands here, after the write

    async def commit(self, session_id: str, **arguments: Any) -> str | None:
        uid = await super().commit(session_id, **arguments)
        await self._landed()
        return uid

    async def fork(self, session_id: str, new_session_id: str, *, at: int) -> None:
        await super().fork(session_id, new_session_id, at=at)
        await self._landed()


@pytest.mark.parametrize("fail_on", [1, 2, 3, 4, 5])
async def test_a_copy_cancelled_part_way_leaves_whole_sessions_and_finishes_when_run_again(
    fail_on: int,
) -> None:
    source, target = MemoryStore(), _CancelledAfter()
    await _fill(source)
    target.fail_on = fail_on
    with anyio.CancelScope() as scope:
        target.scope = scope
        await copy_sessions(source, target, ["a", "a-late", "a-late-child", "b"])
    assert scope.cancelled_caught
    left = [info.session_id for info in await target.sessions()]
    assert len(left) < 4
    for name in left:
        await _same(source, target, name)
    target.scope = None
    report = await copy_sessions(source, target, ["a", "a-late", "a-late-child", "b"])
    assert set(report.copied) | {name for name, _ in report.skipped} == {
        "a",
        "a-late",
        "a-late-child",
        "b",
    }
    for name in ("a", "a-late", "a-late-child", "b"):
        await _same(source, target, name)


async def _same(source: Store, target: Store, name: str) -> None:
    held, got = await source.read(name), await target.read(name)
    assert list(got.events) == list(held.events)
    assert (got.count, got.horizon, dict(got.keys), list(got.kept)) == (
        held.count,
        held.horizon,
        dict(held.keys),
        list(held.kept),
    )


class _LostForkReply(MemoryStore):
    """A store whose first fork lands but whose reply is lost."""

    failed = False

    async def fork(self, session_id: str, new_session_id: str, *, at: int) -> None:
        await super().fork(session_id, new_session_id, at=at)
        if not self.failed:
            self.failed = True
            raise StoreError("the connection dropped")


async def test_a_fork_whose_reply_is_lost_is_deleted_and_made_again() -> None:
    source, target = MemoryStore(), _LostForkReply()
    await _fill(source)
    with pytest.raises(StoreError, match="the connection dropped"):
        await copy_sessions(source, target, ["a", "a-late"])
    assert [info.session_id for info in await target.sessions()] == ["a"]
    report = await copy_sessions(source, target, ["a", "a-late"])
    assert report.forked == ("a-late",)
    await _same(source, target, "a-late")


async def test_the_target_lists_the_copies_by_their_metadata(stores: tuple[Store, Store]) -> None:
    source, target = stores
    await _fill(source)
    async with SessionActor.open(session_id="b", store=source) as actor:
        await actor.set_metadata(SessionMetadata(owner="bob", tags=("t",)))
        await actor.fork("b-fork")
    async with SessionActor.open(session_id="b-fork", store=source) as actor:
        await actor.set_metadata(SessionMetadata(owner="carl"))
    await copy_sessions(source, target)
    assert supports(source, ListingStore)
    assert supports(target, ListingStore)
    for where in ({"owner": "ann"}, {"owner": "bob"}, {"owner": "carl"}):
        listed = [
            sorted(
                (entry.session_id, entry.metadata, entry.count)
                for entry in (await store.list_sessions(where=where)).sessions
            )
            for store in (source, target)
        ]
        assert listed[0]
        assert listed[1] == listed[0]


async def test_a_session_whose_snapshot_dropped_its_newest_events_comes_as_it_is(
    stores: tuple[Store, Store],
) -> None:
    """A snapshot may drop the newest events (a message and the remove that took it off the
    surface): the count and horizon stay past every held seq, and the copy keeps them (its
    commit refused a horizon past the count its events made)."""
    source, target = stores
    async with SessionActor.open(session_id="tail", store=source) as actor:
        await actor.append_many([Message.user(f"m{n}") for n in range(5)], key="k")  # 0..4
        await actor.remove(4, 4)  # 5
        await actor.snapshot()
    async with SessionActor.open(session_id="plain", store=source) as actor:
        await actor.append_many([Message.user(f"m{n}") for n in range(3)])  # 0..2
        await actor.remove(2, 2)  # 3
        await actor.snapshot()
    held = await source.read("tail")
    assert (held.count, held.horizon, held.events[-1].seq) == (6, 6, 3)
    assert set((await copy_sessions(source, target)).copied) == {"tail", "plain"}
    for name in ("tail", "plain"):
        await _same(source, target, name)


async def test_a_session_whose_snapshot_dropped_every_event_comes_as_it_is(
    stores: tuple[Store, Store],
) -> None:
    """A session whose surface was emptied and then snapshotted holds no event, only its
    count and horizon (and, with a key, the kept events): it is copied, where it used to be
    skipped, and goes on at its count."""
    source, target = stores
    async with SessionActor.open(session_id="bare", store=source) as actor:
        await actor.append_many([Message.user("a"), Message.user("b")])  # 0, 1
        await actor.remove(0, 1)  # 2
        await actor.snapshot()
    async with SessionActor.open(session_id="keyed", store=source) as actor:
        await actor.append_many([Message.user("a"), Message.user("b")], key="k")  # 0, 1
        await actor.remove(0, 1)  # 2
        await actor.snapshot()
    bare = await source.read("bare")
    assert (list(bare.events), bare.count, bare.horizon) == ([], 3, 3)
    report = await copy_sessions(source, target)
    assert (set(report.copied), report.skipped) == ({"bare", "keyed"}, ())
    for name in ("bare", "keyed"):
        await _same(source, target, name)
    async with SessionActor.open(session_id="bare", store=target) as actor:
        assert actor.messages() == []
        event = await actor.add_message(Message.user("again"))
    assert event.seq == 3
    async with SessionActor.open(session_id="keyed", store=target) as actor:
        again = await actor.append_many([Message.user("a"), Message.user("b")], key="k")
    assert [e.seq for e in again] == [0, 1]  # the key still answers with what it appended
