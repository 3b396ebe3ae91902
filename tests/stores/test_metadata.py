"""Session metadata, listing and retention on every built-in store (the listing conformance
suite), and what only one place shows: the record's validation, the log keeping it, the query
plans, the schema migration, the registry, and the CLI."""

from __future__ import annotations

import os
import sqlite3
import subprocess
import sys
import time
import uuid
from collections.abc import AsyncIterator, Iterator
from contextlib import closing
from datetime import UTC, datetime, timedelta
from pathlib import Path

import anyio
import attrs
import orjson
import pytest

from nous_session import InvalidEventError, Message, SessionActor, Sessions
from nous_session.codec import encode
from nous_session.event import Event, EventType
from nous_session.listing import ListQuery, metadata_of
from nous_session.log import Log
from nous_session.metadata import SessionMetadata
from nous_session.retention import apply, parse_duration
from nous_session.stores import MemoryStore, Store
from nous_session.stores.sqlite import SCHEMA_VERSION, SQLiteStore
from nous_session.stores.sqlite._schema import MIGRATIONS
from nous_session.stores.sqlite._sql import listing
from nous_session.testing import ListingConformance

psycopg = pytest.importorskip("psycopg")
from nous_session.stores.postgres import PostgresStore  # noqa: E402
from nous_session.stores.postgres._sql import listing as pg_listing  # noqa: E402

POSTGRES_URL = os.environ.get("NOUS_SESSION_TEST_POSTGRES")
needs_postgres = pytest.mark.skipif(
    not POSTGRES_URL,
    reason="no PostgreSQL server: set NOUS_SESSION_TEST_POSTGRES=postgresql://...",
)


class TestMemoryListing(ListingConformance):
    @pytest.fixture
    async def store(self) -> AsyncIterator[Store]:
        store = MemoryStore()
        yield store
        await store.aclose()


class TestSQLiteListing(ListingConformance):
    @pytest.fixture
    async def store(self, tmp_path: Path) -> AsyncIterator[Store]:
        store = SQLiteStore(tmp_path / "sessions.sqlite3")
        yield store
        await store.aclose()


@pytest.fixture
def schema() -> Iterator[str]:
    name = f"t_{uuid.uuid4().hex[:16]}"
    yield name
    if POSTGRES_URL:
        with psycopg.connect(POSTGRES_URL, autocommit=True) as connection:
            connection.execute(f"DROP SCHEMA IF EXISTS {name} CASCADE")


@needs_postgres
class TestPostgresListing(ListingConformance):
    @pytest.fixture
    async def store(self, schema: str) -> AsyncIterator[Store]:
        store = PostgresStore(POSTGRES_URL, schema=schema)  # type: ignore[arg-type]
        yield store
        await store.aclose()


# The record -----------------------------------------------------------------------------------


def test_metadata_round_trips_as_json_and_compares_by_value() -> None:
    record = SessionMetadata(owner="ann", app="chat", title="T", tags=["b", "a"], extra={"n": 1})
    assert record.to_json() == {
        "owner": "ann",
        "app": "chat",
        "title": "T",
        "tags": ["a", "b"],
        "extra": {"n": 1},
    }
    assert SessionMetadata.from_json(record.to_json()) == record
    assert SessionMetadata.coerce(record) is record
    assert hash(SessionMetadata.coerce(record.to_json())) == hash(record)
    assert SessionMetadata().to_json() == {}


@pytest.mark.parametrize(
    ("data", "message"),
    [
        ({"owner": ""}, "owner must be a non-empty string"),
        ({"owner": 7}, "owner must be a non-empty string"),
        ({"app": "a\x00b"}, "app cannot contain NUL"),
        ({"title": "x" * 1025}, "title is at most 1024"),
        ({"tags": "abc"}, "tags must be a collection"),
        ({"tags": ["ok", ""]}, "tag must be a non-empty string"),
        ({"tags": [f"t{i}" for i in range(65)]}, "at most 64 tags"),
        ({"extra": {"x": float("nan")}}, r'extra\["x"\]'),
        ({"extra": []}, "extra must be a mapping"),
        ({"extra": {"blob": "x" * 20000}}, "at most 16384 bytes"),
        ({"user": "ann"}, "unknown session metadata field"),
        ("ann", "must be a mapping"),
    ],
)
def test_bad_metadata_is_refused_naming_the_field(data: object, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        SessionMetadata.coerce(data)


def test_the_log_keeps_metadata_through_snapshots_and_upto() -> None:
    log = Log().append(EventType.METADATA, {"metadata": {"owner": "ann"}})
    log = log.append("user_message", {"content": "a"})
    log = log.append(EventType.METADATA, {"metadata": {"owner": "bob"}})
    log = log.append("user_message", {"content": "b"})
    log = log.append("replace", {"surface_op": ["replace", 0, 3], "messages": []})
    snapped = log.snapshot()
    assert [e.type for e in snapped.events()].count(EventType.METADATA) == 2
    assert metadata_of(snapped.events()) == SessionMetadata(owner="bob")
    assert metadata_of(log.upto(1).events()) == SessionMetadata(owner="ann")
    assert metadata_of(Log().events()) is None


def test_cursor_queries_check_their_arguments() -> None:
    query = ListQuery.make(where={"owner": "ann"})
    assert query.owner == "ann"
    with pytest.raises(ValueError, match="matched against a string"):
        ListQuery.make(where={"n": [1]})
    with pytest.raises(ValueError, match="descending"):
        ListQuery.make(descending="yes")  # type: ignore[arg-type]
    with pytest.raises(TypeError, match=r"unexpected keyword arguments: cursr \(it takes where,"):
        ListQuery.make(cursr="x")  # type: ignore[call-arg]
    assert ListQuery.make() == ListQuery()  # the defaults are the query's


@pytest.mark.anyio
async def test_open_validates_metadata_before_anything_is_written() -> None:
    store = MemoryStore()
    with pytest.raises(ValueError, match="unknown session metadata field"):
        async with SessionActor.open(session_id="a", store=store, metadata={"who": "x"}):
            pass
    assert (await store.read("a")).count == 0


@pytest.mark.anyio
async def test_a_rewind_leaves_the_metadata_alone() -> None:
    async with SessionActor.open(session_id="a", metadata={"owner": "ann"}) as session:
        await session.add_message(Message.user("hi"))
        await session.set_metadata({"owner": "bob"})
        await session.rewind(0)
        assert session.metadata == SessionMetadata(owner="bob")
        assert session.messages() == []


@pytest.mark.anyio
async def test_the_registry_sets_metadata_when_it_opens(tmp_path: Path) -> None:
    async with SQLiteStore(tmp_path / "r.sqlite3") as store:
        async with Sessions(store) as sessions:
            actor = await sessions.get("a", metadata={"owner": "ann"})
            assert actor.metadata == SessionMetadata(owner="ann")
            async with sessions.use("a", metadata={"owner": "ann"}) as same:
                assert same.log.count == 1  # unchanged: nothing appended
        (entry,) = (await store.list_sessions(where={"owner": "ann"})).sessions
        assert entry.session_id == "a"


# Plans: the listing is served by an index ------------------------------------------------------


async def _bulk(path: Path, sessions: int) -> None:
    async with SQLiteStore(path) as store:
        for index in range(sessions):
            await store.commit(
                f"s{index}",
                expected_count=0,
                events=[
                    Event(
                        0,
                        EventType.METADATA,
                        {"metadata": {"owner": f"u{index % 10}"}},
                        datetime.now(UTC),
                    )
                ],
            )


@pytest.mark.anyio
async def test_sqlite_serves_owner_newest_first_from_an_index(tmp_path: Path) -> None:
    path = tmp_path / "plan.sqlite3"
    await _bulk(path, 50)
    with closing(sqlite3.connect(path)) as connection:
        connection.execute("ANALYZE")
        for query in (
            ListQuery.make(where={"owner": "u1"}, limit=20),
            ListQuery.make(where={"owner": "u1"}, limit=20, order="created", descending=False),
            ListQuery.make(limit=20),
        ):
            # The first page, and a later one (after a cursor's position).
            for shown in (query, attrs.evolve(query, after=(2**62, "s5"))):
                statement, parameters = listing(shown)
                plan = " ".join(
                    str(row[3])
                    for row in connection.execute("EXPLAIN QUERY PLAN " + statement, parameters)
                )
                index = "owner_" if query.where else ""
                assert f"USING INDEX nous_sessions_{index}{query.order}" in plan, plan
                assert "TEMP B-TREE" not in plan, plan  # no sort: the index gives the order
        async with SQLiteStore(path, read_only=True) as reader:
            page = await reader.list_sessions(where={"owner": "u1"}, limit=2)
        statement, parameters = listing(
            ListQuery.make(where={"owner": "u1"}, limit=2, cursor=page.cursor)
        )
        plan = str(connection.execute("EXPLAIN QUERY PLAN " + statement, parameters).fetchall())
        assert "nous_sessions_owner_active (owner=? AND (active,name)<(?,?))" in plan, plan


@needs_postgres
@pytest.mark.anyio
async def test_postgres_serves_owner_newest_first_from_an_index(schema: str) -> None:
    store = PostgresStore(POSTGRES_URL, schema=schema)  # type: ignore[arg-type]
    async with store:
        for index in range(30):
            await store.commit(
                f"s{index}",
                expected_count=0,
                events=[
                    Event(
                        0,
                        EventType.METADATA,
                        {"metadata": {"owner": f"u{index % 3}"}},
                        datetime.now(UTC),
                    )
                ],
            )
        page = await store.list_sessions(where={"owner": "u1"}, limit=2)
        statement, parameters = pg_listing(
            store._sql, ListQuery.make(where={"owner": "u1"}, limit=2, cursor=page.cursor)
        )
    with psycopg.connect(POSTGRES_URL, autocommit=True) as connection:
        # A table this small is cheaper to scan: forbid scans and sorts, and the plan must
        # still answer (an index that serves both the filter and the order).
        connection.execute("SET enable_seqscan = off")
        connection.execute("SET enable_sort = off")
        plan = "\n".join(
            row[0]
            for row in connection.execute(b"EXPLAIN " + statement.as_bytes(connection), parameters)
        )
    assert "nous_sessions_owner_active" in plan, plan
    assert "Sort" not in plan, plan


# Migration ----------------------------------------------------------------------------------


def test_a_version_2_file_gets_times_from_its_events(tmp_path: Path) -> None:
    path = tmp_path / "old.sqlite3"
    first = datetime(2025, 1, 2, 3, 4, 5, 678901, tzinfo=UTC)
    last = first + timedelta(days=3)
    with closing(sqlite3.connect(path)) as connection:
        connection.execute("CREATE TABLE nous_schema (version INTEGER NOT NULL)")
        for step in (0, 1):
            for statement in MIGRATIONS[step]:
                connection.execute(statement)
        connection.execute("INSERT INTO nous_schema VALUES (2)")
        connection.execute("INSERT INTO nous_sessions (name, count, held) VALUES ('old', 2, 2)")
        for seq, when in ((0, first), (1, last)):
            event = Event(seq, EventType.USER_MESSAGE, {"content": "x"}, when)
            connection.execute("INSERT INTO nous_events VALUES (1, ?, ?)", (seq, encode(event)))
        connection.commit()

    async def check() -> None:
        async with SQLiteStore(path) as store:
            (entry,) = (await store.list_sessions()).sessions
            assert (entry.session_id, entry.created, entry.active) == ("old", first, last)
            assert entry.metadata == SessionMetadata()
            assert len(await store.load("old")) == 2

    anyio.run(check)
    with closing(sqlite3.connect(path)) as connection:
        version = connection.execute("SELECT version FROM nous_schema").fetchone()
        assert version == (SCHEMA_VERSION,)


# Retention ----------------------------------------------------------------------------------


def test_durations_parse_and_bad_ones_are_named() -> None:
    assert parse_duration("90d") == timedelta(days=90)
    assert parse_duration("2w") == timedelta(weeks=2)
    assert parse_duration("36h") == timedelta(hours=36)
    for bad in ("", "d", "9", "1.5d", "-1d", "10y", "٣d"):
        with pytest.raises(ValueError, match="duration"):
            parse_duration(bad)


async def _session(store: Store, name: str, owner: str = "ann") -> None:
    async with SessionActor.open(session_id=name, store=store, metadata={"owner": owner}) as s:
        await s.add_message(Message.user(f"{name} 1"))
        await s.add_message(Message.user(f"{name} 2"))
        await s.replace(0, 2, Message.system(f"{name} summary"))


@pytest.mark.anyio
async def test_retention_selects_by_idleness_and_age_and_a_dry_run_changes_nothing(
    any_store: Store,
) -> None:
    for name in ("a", "b", "c"):
        await _session(any_store, name, owner="bob" if name == "c" else "ann")
    later = datetime.now(UTC) + timedelta(days=100)
    before = [await any_store.read(name) for name in ("a", "b", "c")]
    report = await apply(any_store, idle_for="90d", now=later)
    assert (report.dry_run, report.done, report.action) == (True, 0, "delete")
    assert [e.session_id for e in report.selected] == ["a", "b", "c"]  # least active first
    assert [await any_store.read(name) for name in ("a", "b", "c")] == before
    assert (await apply(any_store, idle_for="90d")).selected == ()  # all active just now
    assert (await apply(any_store, older_than="90d", now=later, where={"owner": "bob"})).selected[
        0
    ].session_id == "c"
    with pytest.raises(ValueError, match="idle_for, older_than or both"):
        await apply(any_store)
    with pytest.raises(ValueError, match="action"):
        await apply(any_store, idle_for="1d", action="archive")  # type: ignore[arg-type]


@pytest.mark.anyio
async def test_retention_deletes_and_keeps_what_was_written_meanwhile(any_store: Store) -> None:
    for name in ("a", "b", "c"):
        await _session(any_store, name)
    later = datetime.now(UTC) + timedelta(days=100)
    seen: list[tuple[int, int]] = []

    async def progress(done: int, total: int) -> None:
        seen.append((done, total))
        if done == 1:  # another process writes to "b" after the selection, before its turn
            async with SessionActor.open(session_id="b", store=any_store) as s:
                await s.add_message(Message.user("still here"))

    report = await apply(any_store, idle_for="90d", now=later, dry_run=False, progress=progress)
    assert (report.done, report.kept, len(report.selected)) == (2, 1, 3)
    assert seen == [(1, 3), (2, 3), (3, 3)]
    assert [(await any_store.read(name)).count > 0 for name in ("a", "b", "c")] == [
        False,
        True,
        False,
    ]


@pytest.mark.anyio
async def test_retention_snapshots_without_making_sessions_active(any_store: Store) -> None:
    for name in ("a", "b"):
        await _session(any_store, name)
    later = datetime.now(UTC) + timedelta(days=100)
    report = await apply(any_store, idle_for="90d", now=later, action="snapshot", dry_run=False)
    assert (report.done, report.kept, report.dropped_events) == (2, 0, 4)
    for name in ("a", "b"):
        log = Log.restore((await any_store.read(name)).events)
        assert [m.text for m in log.derive_messages()] == [f"{name} summary"]
        assert metadata_of(log.events()) == SessionMetadata(owner="ann")
    again = await apply(any_store, idle_for="90d", now=later, action="snapshot")
    assert len(again.selected) == 2  # a snapshot appends nothing: still idle


# The command line -----------------------------------------------------------------------------


def cli(*args: str, store: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    result = subprocess.run(
        [sys.executable, "-m", "nous_session", "--store", store, *args],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    if check:
        assert result.returncode == 0, result.stderr
    return result


def _tree(root: Path) -> dict[str, bytes]:
    return {
        str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()
    }


def test_cli_lists_pages_sets_metadata_and_retains(tmp_path: Path) -> None:
    path = tmp_path / "cli.sqlite3"
    url = f"sqlite:///{path}"

    async def fill() -> None:
        async with SQLiteStore(path) as store:
            for index in range(5):
                await _session(store, f"s{index}", owner="ann" if index % 2 else "bob")

    anyio.run(fill)
    written = time.monotonic()
    # Reading creates and changes nothing: listings, a dry run, a look at metadata.
    before = _tree(tmp_path)
    rows = [
        orjson.loads(line)
        for line in cli("sessions", "--where", "owner=ann", "--json", store=url).stdout.splitlines()
    ]
    assert [row["session_id"] for row in rows] == ["s3", "s1"]
    assert rows[0]["metadata"] == {"owner": "ann"}
    assert rows[0]["count"] == 4
    first = [
        orjson.loads(line)
        for line in cli(
            "sessions", "--limit", "2", "--ascending", "--json", store=url
        ).stdout.splitlines()
    ]
    assert [row.get("session_id") for row in first[:2]] == ["s0", "s1"]
    rest = cli("sessions", "--limit", "2", "--ascending", "--cursor", first[2]["cursor"], store=url)
    assert [line.split()[0] for line in rest.stdout.splitlines()[1:3]] == ["s2", "s3"]
    assert "more: --cursor" in rest.stdout
    bad = cli(
        "sessions", "--where", "owner=ann", "--cursor", first[2]["cursor"], store=url, check=False
    )
    assert (bad.returncode, "different query" in bad.stderr) == (1, True)
    assert cli("metadata", "s1", "--json", store=url).stdout.strip() == '{"owner":"ann"}'
    # Idle for 1 s means last active more than 1 s ago, and the store keeps the last-active
    # time to the second: 2 s after the last write every session is idle for 1 s, however fast
    # the commands above ran (the test relied on their taking long enough).
    time.sleep(max(0.0, written + 2.05 - time.monotonic()))
    dry = cli("retain", "--idle-for", "1s", "--where", "owner=bob", store=url).stdout
    assert "would delete 3 sessions (dry run: pass --yes to do it)" in dry
    assert _tree(tmp_path) == before
    missing = tmp_path / "missing.sqlite3"
    for args in (("sessions", "--limit", "5"), ("retain", "--idle-for", "1d")):
        result = cli(*args, store=f"sqlite:///{missing}", check=False)
        assert result.returncode == 1
        assert result.stderr.strip().startswith(f"nous-session: error: no store file at {missing};")
    assert not missing.exists()
    # Writing.
    out = cli("metadata", "s1", "--set", '{"owner": "ann", "tags": ["vip"]}', store=url).stdout
    assert "set the metadata of 's1'" in out
    assert cli("sessions", "--tag", "vip", store=url).stdout.splitlines()[1].split()[0] == "s1"
    refused = cli("metadata", "s1", "--set", '{"who": 1}', store=url, check=False)
    assert refused.returncode == 1
    assert "unknown session metadata field" in refused.stderr
    done = cli("retain", "--idle-for", "1s", "--where", "owner=bob", "--yes", "--json", store=url)
    summary = orjson.loads(done.stdout.splitlines()[-1])
    assert (summary["done"], summary["kept"], summary["dry_run"]) == (3, 0, False)
    rows = [
        orjson.loads(line)
        for line in cli("sessions", "--limit", "10", "--json", store=url).stdout.splitlines()
    ]
    assert sorted(row["session_id"] for row in rows) == ["s1", "s3"]
    unbounded = cli("retain", "--yes", store=url, check=False)
    assert (unbounded.returncode, unbounded.stderr.strip()) == (
        1,
        "nous-session: error: retain needs --idle-for, --older-than or both",
    )


@pytest.mark.anyio
async def test_a_rebased_commit_sets_metadata_where_its_event_lands(any_store: Store) -> None:
    async with (
        SessionActor.open(
            session_id="r", store=any_store, on_conflict="rebase", follow=False
        ) as first,
        SessionActor.open(
            session_id="r", store=any_store, on_conflict="rebase", follow=False
        ) as second,
    ):
        await first.add_message(Message.user("one"))  # seq 0; `second` has not seen it
        event = await second.set_metadata({"owner": "ann", "title": "rebased"})
        assert event.seq == 1  # moved past what the other writer stored
    (entry,) = (await any_store.list_sessions(where={"owner": "ann"})).sessions  # type: ignore[attr-defined]
    assert entry.metadata.title == "rebased"
    assert entry.count == 2
    # The store knows the record's seq: a fork before it has no metadata, one at it has it.
    await any_store.fork("r", "before", at=0)  # type: ignore[attr-defined]
    await any_store.fork("r", "at", at=1)  # type: ignore[attr-defined]
    assert await _titles(any_store) == {"r": "rebased", "at": "rebased"}


async def _titles(store: Store) -> dict[str, str | None]:
    page = await store.list_sessions(where={"owner": "ann"})  # type: ignore[attr-defined]
    return {entry.session_id: entry.metadata.title for entry in page.sessions}


@pytest.mark.anyio
async def test_a_metadata_event_must_hold_a_valid_record() -> None:
    store = MemoryStore()
    async with SessionActor.open(session_id="a", store=store) as session:
        with pytest.raises(InvalidEventError, match="metadata owner must be a non-empty string"):
            await session.append(EventType.METADATA, {"metadata": {"owner": 5}})
        with pytest.raises(InvalidEventError, match="holds exactly"):
            await session.append(EventType.METADATA, {"metadata": {}, "more": 1})
        assert session.log.count == 0
    assert (await store.read("a")).count == 0


@needs_postgres
def test_a_version_2_postgres_schema_gets_times_from_its_events(schema: str) -> None:
    from psycopg import sql

    from nous_session.stores.postgres._schema import MIGRATIONS as PG_MIGRATIONS

    first = datetime(2025, 1, 2, 3, 4, 5, 678901, tzinfo=UTC)
    last = first + timedelta(days=3)
    with psycopg.connect(POSTGRES_URL, autocommit=True) as connection:
        name = sql.Identifier(schema)
        connection.execute(sql.SQL("CREATE SCHEMA {}").format(name))
        connection.execute(sql.SQL("CREATE TABLE {}.nous_schema (version integer)").format(name))
        for step in (0, 1):
            for statement in PG_MIGRATIONS[step]:
                connection.execute(sql.SQL(statement).format(schema=name))
        connection.execute(sql.SQL("INSERT INTO {}.nous_schema VALUES (2)").format(name))
        connection.execute(
            sql.SQL("INSERT INTO {}.nous_sessions (name, count) VALUES ('old', 2)").format(name)
        )
        for seq, when in ((0, first), (1, last)):
            event = Event(seq, EventType.USER_MESSAGE, {"content": "x"}, when)
            connection.execute(
                sql.SQL("INSERT INTO {}.nous_events VALUES ('old', %s, %s)").format(name),
                (seq, encode(event)),
            )

    async def check() -> None:
        async with PostgresStore(POSTGRES_URL, schema=schema) as store:  # type: ignore[arg-type]
            (entry,) = (await store.list_sessions()).sessions
            assert (entry.session_id, entry.created, entry.active) == ("old", first, last)
            assert entry.metadata == SessionMetadata()

    anyio.run(check)


@pytest.mark.anyio
async def test_a_listing_argument_it_does_not_take_is_named(any_store: Store) -> None:
    with pytest.raises(
        TypeError, match=r"list_sessions\(\) got unexpected keyword arguments: cursr"
    ):
        await any_store.list_sessions(where={"owner": "ann"}, cursr=None)  # type: ignore[attr-defined]
