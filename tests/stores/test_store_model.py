"""The stores against each other: every operation of the Store contract, applied alike to a
MemoryStore (the reference), a SQLiteStore and (with ``NOUS_SESSION_TEST_POSTGRES``) a
PostgresStore, must get the same answer from each.

A hypothesis ``RuleBasedStateMachine`` works on a few sessions with small seqs, so that
conflicts and edge cases come often: commits with right and wrong expected counts and
horizons, idempotency keys and commit ids new and reused, snapshots that drop events and keep
a key's events aside (naming their horizon or, as the first contract did, not), imports that
leave gaps below the horizon they set, rebasing commits behind the head, forks at valid and
invalid points (below a horizon, of an unknown session, onto an existing one), deletes of
parents and of forks in the middle of a lineage, deletes of idle sessions, metadata events,
erasures of events and of sessions (with and without the summaries that copy them) and leases.
Each answer is the return value, or the type of the exception raised.

The disagreements it found are examples at the end of this module.

After every step every session reads the same in each store: ``read`` from 0 and from the
middle (events, count, horizon, keys, kept, lineage), ``load``, ``sessions()``, where each
commit id landed, and listings paged two at a time, filtered by owner and tag, ordered by
creation (its times are each store's clock: only their order is compared, and only the
created order, as a store may keep the last-active time to the second).

Runs on asyncio and trio; the PostgreSQL variant skips without a server.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from contextlib import ExitStack
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, ClassVar

import attrs
import pytest
from anyio.from_thread import BlockingPortal, start_blocking_portal
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    rule,
    run_state_machine_as_test,
)

from nous_session.stores.base import Store, Stored
from tests.support.store_model import (
    ERASED_AT,
    SESSION_REASON,
    Backends,
    backends,
    committed,
    committed_rebased,
    metadata,
    outcome,
    summary,
    user,
)
from tests.support.tallies import Tallies

PROFILE = os.environ.get("HYPOTHESIS_PROFILE", "dev")
if PROFILE == "ci":
    EXAMPLES, STEPS = 60, 25
elif PROFILE == "quick":
    EXAMPLES, STEPS = 10, 15
else:
    EXAMPLES, STEPS = 30, 25

NAMES = ("a", "b", "c", "d")
KEYS = ("k1", "k2", "k3", "k4", "k5")
COMMIT_IDS = ("c1", "c2", "c3")
LINE = (
    f"store model ({PROFILE} profile): {{steps}} answers compared, {{disagreements}}"
    " disagreements, {conflicts} conflicts, {refused} refused as malformed on"
    " {combinations} store and loop combinations"
)

names = st.sampled_from(NAMES)
keys = st.none() | st.tuples(st.sampled_from(KEYS), st.integers(0, 2), st.integers(1, 3))
commit_ids = st.none() | st.sampled_from(COMMIT_IDS)
# A commit's expected_uid: none (mostly), the session's own in each store, or one no session has.
identities = st.sampled_from([None, None, None, "own", "own", "other"])
kinds = st.lists(st.sampled_from(["user", "user", "meta", "summary"]), min_size=3, max_size=3)


@attrs.define
class Tally:
    steps: int = 0
    disagreements: int = 0
    conflicts: int = 0
    refused: int = 0


class StoreModel(RuleBasedStateMachine):
    """The same operations on every store; the MemoryStore's answers are the reference."""

    backends: ClassVar[Backends]
    loop: ClassVar[str]
    tally: ClassVar[Tally]

    def __init__(self) -> None:
        super().__init__()
        self.stores: list[tuple[str, Any]] = self.backends.make()  # nothing opened yet
        self.stack = ExitStack()
        self.portal: BlockingPortal = self.stack.enter_context(start_blocking_portal(self.loop))
        self.stack.callback(self._close)
        self.counter = iter(range(1 << 30))
        self.marks: list[datetime] = []  # moments between steps, for created_since

    def _close(self) -> None:
        for _, store in self.stores:
            self.portal.call(store.aclose)

    def teardown(self) -> None:
        self.stack.close()
        self.backends.drop()  # each example's PostgreSQL schema, as soon as it is done

    # Running one operation everywhere

    def each(self, call: Any) -> tuple[str, object]:
        """``call(kind, store)`` on every store: each answer must be the reference's."""
        answers = [
            (kind, self.portal.call(outcome, lambda kind=kind, store=store: call(kind, store)))
            for kind, store in self.stores
        ]
        reference: tuple[str, object] = answers[0][1]
        for kind, answer in answers[1:]:
            if answer != reference:
                type(self).tally.disagreements += 1
            assert answer == reference, (kind, answer, "memory:", reference)
        if reference == ("raised", "ConflictError"):
            type(self).tally.conflicts += 1
        elif reference == ("raised", "ValueError"):
            type(self).tally.refused += 1
        type(self).tally.steps += 1
        return reference

    def reference(self, name: str) -> Stored:
        """The session as the reference holds it (what a rule builds its arguments on)."""
        stored: Stored = self.portal.call(lambda: self.stores[0][1].read(name))
        return stored

    def events(self, start: int, n: int, chosen: list[str]) -> list[Any]:
        made = []
        for offset in range(n):
            seq = start + offset
            number = next(self.counter)
            kind = chosen[offset % len(chosen)]
            if kind == "meta":
                made.append(metadata(seq, number))
            elif kind == "summary" and seq > 0:
                made.append(summary(seq, max(0, seq - 3), f"t{number}"))
            else:
                made.append(user(seq, f"t{number}"))
        return made

    @staticmethod
    def key_of(key: tuple[str, int, int] | None, first: int, n: int) -> list[tuple[str, int, int]]:
        """A key over some of ``n`` events from ``first`` (over none when there are none)."""
        if key is None:
            return []
        name, offset, size = key
        if n == 0:
            return [(name, first, size)]  # malformed: names no event of the commit
        offset = min(offset, n - 1)
        return [(name, first + offset, min(size, n - offset))]

    # Rules

    @initialize(sizes=st.lists(st.integers(1, 4), min_size=2, max_size=2))
    def start(self, sizes: list[int]) -> None:
        """Two sessions to start with (the others are unknown until a commit or a fork)."""
        for name, n in zip(NAMES, sizes, strict=False):
            events = self.events(0, n, ["user", "summary", "meta"])
            self.each(
                lambda _, store, name=name, events=events: committed(
                    store, name, expected_count=0, events=events, keys=[("k1", 0, 1)]
                )
            )

    @rule(
        name=names,
        n=st.integers(0, 3),
        chosen=kinds,
        delta=st.sampled_from([0, 0, 0, 0, 0, 0, -1, 1]),
        key=keys,
        commit_id=commit_ids,
        expected_horizon=st.sampled_from([None, None, None, 0, 0, 1]),
        identity=identities,
    )
    def commit(
        self,
        name: str,
        n: int,
        chosen: list[str],
        delta: int,
        key: tuple[str, int, int] | None,
        commit_id: str | None,
        expected_horizon: int | None,
        identity: str | None,
    ) -> None:
        stored = self.reference(name)
        expected = max(0, stored.count + delta)
        events = self.events(expected, n, chosen)
        keyed = self.key_of(key, expected, n)
        if expected_horizon is not None:  # right (+0) or wrong (+1)
            expected_horizon = min(stored.horizon + expected_horizon, expected)
        self.each(
            lambda _, store: committed(
                store,
                name,
                identity,
                expected_count=expected,
                events=events,
                keys=keyed,
                commit_id=commit_id,
                expected_horizon=expected_horizon,
            )
        )

    @rule(
        name=names,
        rise=st.integers(0, 3),
        drop=st.sampled_from(["all", "some", "none", "above"]),
        keep=st.sampled_from(["keyed", "none", "all"]),
        horizon_mode=st.sampled_from(["named", "named", "legacy", "expected_only"]),
        expected_horizon=st.sampled_from([0, 0, 0, 1, -1]),
        delta=st.sampled_from([0, 0, 0, -1]),
        n=st.integers(0, 2),
        chosen=kinds,
        commit_id=commit_ids,
    )
    def snapshot(
        self,
        name: str,
        rise: int,
        drop: str,
        keep: str,
        horizon_mode: str,
        expected_horizon: int,
        delta: int,
        n: int,
        chosen: list[str],
        commit_id: str | None,
    ) -> None:
        """A commit that drops events below a new horizon and keeps a key's aside."""
        stored = self.reference(name)
        expected = max(0, stored.count + delta)
        events = self.events(expected, n, chosen)
        new_count = expected + n
        horizon = min(stored.horizon + rise, new_count)
        below = [e.seq for e in stored.events if e.seq < horizon]
        if drop == "all":
            dropped = below
        elif drop == "some":
            dropped = below[::2]
        elif drop == "above":  # a hole at or above the horizon: refused
            dropped = [*below, horizon] if horizon < expected else below
        else:
            dropped = []
        keyed = {seq for first, size in stored.keys.values() for seq in range(first, first + size)}
        if keep == "keyed":
            kept = [seq for seq in dropped if seq in keyed]
        elif keep == "all":
            kept = list(dropped)
        else:
            kept = []
        arguments: dict[str, Any] = {}
        if horizon_mode in ("named", "expected_only"):
            arguments["expected_horizon"] = max(0, stored.horizon + expected_horizon)
        if horizon_mode == "named":
            arguments["horizon"] = horizon
        self.each(
            lambda _, store: committed(
                store,
                name,
                expected_count=expected,
                events=events,
                dropped=dropped,
                kept=kept,
                commit_id=commit_id,
                **arguments,
            )
        )

    @rule(
        name=names,
        present=st.lists(st.booleans(), min_size=6, max_size=6),
        rise=st.integers(0, 6),
        chosen=kinds,
        key=keys,
        expected_horizon=st.booleans(),
    )
    def import_history(
        self,
        name: str,
        present: list[bool],
        rise: int,
        chosen: list[str],
        key: tuple[str, int, int] | None,
        expected_horizon: bool,
    ) -> None:
        """A commit that sets a horizon and leaves gaps below it (an import of a snapshotted
        history): the count becomes one past the highest seq written. Gaps at or above the
        horizon are refused."""
        stored = self.reference(name)
        start = stored.count
        horizon = max(stored.horizon, start + rise)
        made = self.events(start, 6, chosen)
        events = [event for event, held in zip(made, present, strict=True) if held]
        keyed = self.key_of(key, events[0].seq, 1) if events else self.key_of(key, start, 0)
        extra = {"expected_horizon": stored.horizon} if expected_horizon else {}
        self.each(
            lambda _, store: committed(
                store,
                name,
                expected_count=start,
                events=events,
                horizon=horizon,
                keys=keyed,
                **extra,
            )
        )

    @rule(
        name=names,
        behind=st.sampled_from([0, 0, 1, 2, -1]),
        n=st.integers(1, 3),
        chosen=kinds,
        key=keys,
        commit_id=commit_ids,
        identity=identities,
    )
    def commit_rebased(
        self,
        name: str,
        behind: int,
        n: int,
        chosen: list[str],
        key: tuple[str, int, int] | None,
        commit_id: str | None,
        identity: str | None,
    ) -> None:
        stored = self.reference(name)
        expected = max(0, stored.count - behind)
        events = self.events(expected, n, chosen)
        keyed = self.key_of(key, expected, n)
        self.each(
            lambda _, store: committed_rebased(
                store,
                name,
                identity,
                expected_count=expected,
                events=events,
                keys=keyed,
                commit_id=commit_id,
            )
        )

    @rule(
        parent=st.integers(0, 7),
        child=st.integers(0, 7),
        at=st.sampled_from(["last", "last", "last", "first", "horizon", "below", "past", "middle"]),
    )
    def fork(self, parent: int, child: int, at: str) -> None:
        """A fork of a session (now and then an unknown one) onto a new name (now and then
        one that exists)."""
        held = [info.session_id for info in self.portal.call(self.stores[0][1].sessions)]
        free = [name for name in NAMES if name not in held]
        source = held[parent % len(held)] if held and parent < 7 else NAMES[parent % len(NAMES)]
        target = free[child % len(free)] if free and child < 6 else NAMES[child % len(NAMES)]
        stored = self.reference(source)
        point = {
            "last": stored.count - 1,
            "first": 0,
            "horizon": stored.horizon - 1,
            "below": stored.horizon - 2,
            "past": stored.count,
            "middle": (stored.horizon + stored.count) // 2,
        }[at]
        self.each(lambda _, store: store.fork(source, target, at=point))

    @rule(name=names)
    def delete(self, name: str) -> None:
        self.each(lambda _, store: store.delete(name))

    @rule(name=names, stale=st.booleans())
    def delete_idle(self, name: str, stale: bool) -> None:
        """Delete a session as each store's own listing saw it (or with a stale count)."""

        async def call(_: str, store: Any) -> bool:
            page = await store.list_sessions(limit=1000)
            found = [entry for entry in page.sessions if entry.session_id == name]
            if not found:
                return bool(await store.delete_idle(name, count=0, active=ERASED_AT))
            entry = found[0]
            count = entry.count + 1 if stale else entry.count
            return bool(await store.delete_idle(name, count=count, active=entry.active))

        self.each(call)

    @rule(
        name=names,
        picks=st.lists(st.integers(0, 1 << 10), min_size=1, max_size=3),
        past=st.sampled_from([False, False, False, True]),
        summaries=st.booleans(),
        dry_run=st.sampled_from([False, False, True]),
    )
    def erase(
        self, name: str, picks: list[int], past: bool, summaries: bool, dry_run: bool
    ) -> None:
        stored = self.reference(name)
        seqs = [pick % max(1, stored.count) for pick in picks]
        if past:
            seqs.append(stored.count)  # not in the session: refused
        self.each(
            lambda kind, store: store.erase(
                name,
                seqs,
                reason="asked",
                at=ERASED_AT,
                dry_run=dry_run,
                summaries=summaries,
                **({} if kind == "memory" else {"rewrite": False}),
            )
        )

    @rule(
        name=names,
        inherited=st.booleans(),
        summaries=st.booleans(),
        dry_run=st.sampled_from([False, False, True]),
    )
    def erase_session(self, name: str, inherited: bool, summaries: bool, dry_run: bool) -> None:
        self.each(
            lambda kind, store: store.erase_session(
                name,
                reason=SESSION_REASON,
                inherited=inherited,
                dry_run=dry_run,
                summaries=summaries,
                **({} if kind == "memory" else {"rewrite": False}),
            )
        )

    @rule(name=names, holder=st.sampled_from(["h1", "h2"]), release=st.booleans())
    def lease(self, name: str, holder: str, release: bool) -> None:
        if release:
            self.each(lambda _, store: store.release(name, "compaction", holder=holder))
        else:
            self.each(lambda _, store: store.lease(name, "compaction", holder=holder, ttl=600))

    @rule()
    def mark(self) -> None:
        """A moment between two steps: sessions created after it, and only they, are listed
        with ``created_since`` it in every store."""
        self.marks.append(datetime.now(UTC))

    # After every step

    @invariant()
    def every_read_agrees(self) -> None:
        for name in NAMES:
            self.each(lambda _, store, name=name: store.read(name))
            self.each(lambda _, store, name=name: store.load(name))
            middle = self.reference(name).count // 2
            self.each(lambda _, store, name=name, middle=middle: store.read(name, since=middle))
            for commit_id in COMMIT_IDS:
                self.each(
                    lambda _, store, name=name, commit_id=commit_id: store.committed(
                        name, commit_id
                    )
                )
        self.each(lambda _, store: store.sessions())

    @invariant()
    def every_listing_agrees(self) -> None:
        for arguments in (
            {"order": "created"},
            {"order": "created", "descending": False, "where": {"owner": "ann"}},
            {"order": "created", "tags": ["red"]},
            {"order": "created", "where": {"n": 2}},
        ):
            self.each(lambda _, store, arguments=arguments: pages(store, arguments))
        self.each(lambda _, store: active_set(store))
        if self.marks:
            since = self.marks[-1]
            self.each(lambda _, store: pages(store, {"order": "created", "created_since": since}))


async def pages(store: Any, arguments: dict[str, Any]) -> list[Any]:
    """Every page of a listing, two sessions a page, as (entries, whether more follow)."""
    found = []
    cursor = None
    while True:
        page = await store.list_sessions(limit=2, cursor=cursor, **arguments)
        found.append(page)
        cursor = page.cursor
        if cursor is None:
            return found


async def active_set(store: Any) -> list[str]:
    """The sessions a listing by last activity pages through, each once, sorted by id (the
    order itself is each store's clock's)."""
    seen: list[str] = []
    cursor = None
    while True:
        page = await store.list_sessions(limit=2, cursor=cursor)
        seen.extend(entry.session_id for entry in page.sessions)
        cursor = page.cursor
        if cursor is None:
            assert len(seen) == len(set(seen)), seen
            return sorted(seen)


@pytest.fixture(params=["sqlite", "postgres"])
def compared(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Backends]:
    yield from backends(request.param, tmp_path)


@pytest.mark.parametrize("loop", ["asyncio", "trio"])
def test_the_stores_answer_alike(compared: Backends, loop: str, tallies: Tallies) -> None:
    tally = Tally()
    machine = type(
        "StoreModel", (StoreModel,), {"backends": compared, "loop": loop, "tally": tally}
    )
    run_state_machine_as_test(
        machine,
        settings=settings(
            # PostgreSQL's round trips make its examples three times as slow: half as many.
            max_examples=EXAMPLES if not compared.postgres else EXAMPLES // 2,
            stateful_step_count=STEPS,
            deadline=None,
            suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
        ),
    )
    tallies.add(LINE, combinations=1, **attrs.asdict(tally))
    assert tally.steps > 0


# What the model found, as examples ------------------------------------------------------


@pytest.mark.anyio
async def test_a_fork_onto_a_session_that_holds_nothing_takes_none_of_its_commit_ids(
    stores: Callable[[], Store],
) -> None:
    """A fork made under the name of a session that holds nothing yet (an empty commit made
    it, recording its commit id) is a new session: that commit id is not the fork's, and
    SQLite left it behind under the replaced row's id, where a session made later with the
    same id read it as its own."""
    store: Any = stores()  # every store here forks and knows its commits
    try:
        await store.commit("a", expected_count=0, events=[user(0, "hi"), user(1, "there")])
        await store.commit("b", expected_count=0, events=[], commit_id="c1")
        await store.commit("c", expected_count=0, events=[], commit_id="c2")
        assert await store.committed("b", "c1") == (0, 0)
        await store.fork("a", "b", at=1)
        await store.fork("a", "c", at=0)
        assert await store.committed("b", "c1") is None
        assert await store.committed("c", "c2") is None
        await store.commit("b", expected_count=2, events=[user(2, "again")], commit_id="c1")
        assert await store.committed("b", "c1") == (2, 1)
        # The rows the forks replaced are gone: sessions made now hold no one's commits.
        assert await store.delete("b")
        assert await store.delete("c")
        await store.commit("d", expected_count=0, events=[user(0, "new")])
        await store.commit("e", expected_count=0, events=[user(0, "new")])
        for name in ("d", "e"):
            for commit_id in ("c1", "c2"):
                assert await store.committed(name, commit_id) is None
    finally:
        await store.aclose()


@pytest.mark.anyio
async def test_a_first_commit_after_an_empty_one_sets_its_horizon(
    stores: Callable[[], Store],
) -> None:
    """A session's first events, committed with a horizon (an import of a snapshotted
    history, its gaps below the horizon), after an empty commit made the session: PostgreSQL
    kept the horizon 0, and the session could not be read (rows missing below it)."""
    store = stores()
    try:
        await store.commit("s", expected_count=0, events=[])
        await store.commit("s", expected_count=0, events=[user(2, "a"), user(3, "b")], horizon=2)
        stored = await store.read("s")
        assert (stored.count, stored.horizon) == (4, 2)
        assert [event.seq for event in await store.load("s")] == [2, 3]
        await store.commit("t", expected_count=0, events=[])
        await store.commit("t", expected_count=0, events=[user(0, "a")], horizon=1)
        assert (await store.read("t")).horizon == 1
    finally:
        await store.aclose()


@pytest.mark.anyio
async def test_a_rebase_behind_a_forks_point_returns_the_events_it_shares(
    stores: Callable[[], Store],
) -> None:
    """A rebasing commit to a fork, from a count at or below its fork point, lands after the
    fork's history: the events in between are the others, its parent's shared ones included
    (PostgreSQL returned only the fork's own)."""
    store: Any = stores()  # every store here forks and rebases
    try:
        await store.commit("p", expected_count=0, events=[user(0, "a"), user(1, "b")])
        await store.fork("p", "f", at=1)
        await store.commit("f", expected_count=2, events=[user(2, "c")])
        done = await store.commit_rebased("f", expected_count=1, events=[user(1, "d")])
        assert done.shift == 2
        assert [(e.seq, e.data["content"]) for e in done.others] == [(1, "b"), (2, "c")]
        assert [e.seq for e in done.events] == [3]
    finally:
        await store.aclose()


@pytest.mark.anyio
async def test_a_key_a_parent_commits_again_after_the_fork_point_hides_nothing_from_its_fork(
    stores: Callable[[], Store],
) -> None:
    """A fork of a fork answers the keys of the whole lineage up to its point: a key its
    parent inherited (from the grandparent, before the point) and committed again after the
    point is still answered as the grandparent's. The MemoryStore laid the parent's own keys
    over the inherited ones before cutting them at the point, and lost it (found on Python
    3.13's run of the model)."""
    store: Any = stores()
    try:
        await store.commit("b", expected_count=0, events=[user(0, "b0")], keys=[("k1", 0, 1)])
        await store.fork("b", "a", at=0)
        await store.fork("a", "c", at=0)
        await store.commit_rebased(
            "a", expected_count=1, events=[user(1, "t1")], keys=[("k1", 1, 1)]
        )
        assert dict((await store.read("a")).keys) == {"k1": (1, 1)}
        assert dict((await store.read("c")).keys) == {"k1": (0, 1)}
    finally:
        await store.aclose()


@pytest.mark.anyio
async def test_a_forks_own_copy_keeps_the_nearest_holders_key_of_each_name(
    stores: Callable[[], Store],
) -> None:
    """A fork of a fork, whose parent committed again a key it inherited: when the parent is
    deleted the fork gets its own copy of what it shared, and of its keys the parent's own
    (the nearer holder's, as a read gave it before). SQLite and PostgreSQL copied the
    grandparent's, so a retry in the fork answered with other events (found by the model)."""
    store: Any = stores()
    try:
        await store.commit("c", expected_count=0, events=[user(0, "c0")], keys=[("k1", 0, 1)])
        await store.fork("c", "b", at=0)
        await store.commit_rebased(
            "b", expected_count=1, events=[user(1, "b1")], keys=[("k1", 1, 1)]
        )
        await store.fork("b", "a", at=1)
        assert dict((await store.read("a")).keys) == {"k1": (1, 1)}
        await store.delete("b")
        held = await store.read("a")
        assert (dict(held.keys), held.parent, held.fork_point) == ({"k1": (1, 1)}, "c", 0)
        assert [event.data["content"] for event in held.events] == ["c0", "b1"]
    finally:
        await store.aclose()
