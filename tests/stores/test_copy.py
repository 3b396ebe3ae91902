"""Copying sessions between stores keeps them as they are: events, horizon, idempotency keys
with their kept events, erasures, metadata, and forks as forks when their parent comes too."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import attrs
import pytest

from nous_session import Message, SessionActor, SessionMetadata
from nous_session.errors import StoreError
from nous_session.stores import CopyError, CopyReport, MemoryStore, Stored, copy_sessions
from nous_session.stores.base import ListingStore, Store, supports
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
        held, got = await source.read(name), await target.read(name)
        assert list(got.events) == list(held.events)
        assert (got.count, got.horizon, dict(got.keys), list(got.kept)) == (
            held.count,
            held.horizon,
            dict(held.keys),
            list(held.kept),
        )
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

    async def commit(self, session_id: str, **arguments: Any) -> None:
        if arguments.get("dropped") and not self.failed:
            self.failed = True
            raise StoreError("the disk is full")
        await super().commit(session_id, **arguments)


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
