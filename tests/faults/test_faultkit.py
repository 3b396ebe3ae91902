"""The fault-injection kit (tests/support/faultkit.py) does what it says, proven with plain psycopg.

The proxy and terminate_backends tests need a server (``NOUS_SESSION_TEST_POSTGRES``; `.ci/run`
starts one); the PostgresServer tests need PostgreSQL's binaries (initdb, pg_ctl) and start a
private cluster of their own. The last test shows, with nous_session's own PostgresStore, the
bug these tools are for: a commit whose reply is lost is reported as failed although it landed.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import AsyncIterator, Iterator
from typing import Any

import anyio
import anyio.to_thread
import pytest

from nous_session import ConflictError, OutcomeUnknownError
from nous_session.event import make_event
from tests.support.faultkit import (
    PostgresServer,
    Reply,
    ReplyDroppingProxy,
    is_data_modifying,
    postgres_unavailable,
    terminate_backends,
)

psycopg = pytest.importorskip("psycopg")
psycopg_pool = pytest.importorskip("psycopg_pool")
from nous_session.stores.postgres import PostgresStore  # noqa: E402

URL = os.environ.get("NOUS_SESSION_TEST_POSTGRES", "")
UNAVAILABLE = postgres_unavailable()

pytestmark = pytest.mark.faults
needs_server = pytest.mark.skipif(
    not URL,
    reason="no PostgreSQL server: set NOUS_SESSION_TEST_POSTGRES=postgresql://... "
    "(`. .ci/postgres` starts one on loopback and sets it)",
)
needs_binaries = pytest.mark.skipif(
    UNAVAILABLE is not None, reason=f"cannot start a private server: {UNAVAILABLE}"
)


def direct(statement: str, *params: object, url: str = URL) -> list[tuple[object, ...]]:
    """Run one statement on a fresh direct connection (never through a proxy)."""
    with psycopg.connect(url, autocommit=True) as connection:
        cursor = connection.execute(statement, params or None)
        return cursor.fetchall() if cursor.description else []


@pytest.fixture
def proxy() -> Iterator[ReplyDroppingProxy]:
    with ReplyDroppingProxy(URL) as proxy:
        yield proxy
        assert proxy.errors == []


@pytest.fixture
def table() -> Iterator[str]:
    name = f"fk_{uuid.uuid4().hex[:16]}"
    direct(f"CREATE TABLE {name} (id integer PRIMARY KEY, note text)")
    yield name
    direct(f"DROP TABLE IF EXISTS {name}")


@pytest.fixture
def schema() -> Iterator[str]:
    name = f"t_{uuid.uuid4().hex[:16]}"
    yield name
    direct(f"DROP SCHEMA IF EXISTS {name} CASCADE")


def ids(table: str) -> list[object]:
    return [row[0] for row in direct(f"SELECT id FROM {table} ORDER BY id")]


# What counts as a write ------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("statement", "expected"),
    [
        ("INSERT INTO t VALUES (1)", True),
        ("update t set note = 'x'", True),
        ("DELETE FROM t", True),
        ("MERGE INTO t USING s ON t.id = s.id WHEN MATCHED THEN DELETE", True),
        ("WITH moved AS (UPDATE s SET n = 1 RETURNING 1) SELECT 1 FROM moved", True),
        ("SELECT 1", False),
        ("SELECT * FROM t FOR UPDATE", False),
        ("SELECT * FROM t FOR NO KEY UPDATE", False),
        ("SELECT 'insert into t', \"update\" FROM t -- delete\n /* merge */", False),
        ("CREATE TABLE c (p int REFERENCES t ON DELETE CASCADE ON UPDATE CASCADE)", False),
        ("COMMIT", False),
    ],
)
def test_what_counts_as_data_modifying(statement: str, expected: bool) -> None:
    assert is_data_modifying(statement) is expected


def test_a_reply_ends_a_write_transaction_only_when_idle_clean_and_written() -> None:
    def reply(tags: tuple[str, ...], status: str = "I", *, failed: bool = False) -> Reply:
        return Reply(1, (), tags, status, failed, (), (), wrote=True)

    assert reply(("INSERT 0 1",)).ends_write_transaction
    assert reply(("SELECT 1",)).ends_write_transaction
    assert reply(("COMMIT",)).ends_write_transaction
    assert not reply(("INSERT 0 1",), "T").ends_write_transaction
    assert not reply(("INSERT 0 1",), failed=True).ends_write_transaction
    assert not reply(("ROLLBACK",)).ends_write_transaction
    assert not reply(()).ends_write_transaction
    assert not Reply(1, (), ("SELECT 1",), "I", False, (), (), False).ends_write_transaction


# The proxy ------------------------------------------------------------------------------------


@needs_server
def test_pass_through_forwards_everything_across_chunk_boundaries(
    proxy: ReplyDroppingProxy,
) -> None:
    with psycopg.connect(proxy.url, autocommit=True) as connection:
        # Messages far larger than a TCP chunk, and very many small ones.
        big = connection.execute("SELECT repeat('x', 5000000)").fetchone()
        assert big is not None
        assert len(big[0]) == 5_000_000
        rows = connection.execute("SELECT n FROM generate_series(1, 20000) AS n").fetchall()
        assert [row[0] for row in rows] == list(range(1, 20001))
        with connection.pipeline():
            cursors = [connection.execute("SELECT %s::int", (n,)) for n in range(50)]
        assert [cursor.fetchone() for cursor in cursors] == [(n,) for n in range(50)]
        # A trigger that matches nothing changes nothing, and a notification to an idle
        # LISTEN connection is forwarded at once (no request is outstanding to hold it for).
        proxy.drop_reply_matching(lambda reply: False)
        connection.execute("LISTEN faultkit")
        direct("NOTIFY faultkit, 'hello'")
        # Waiting for the server to deliver the notification: a deadline, not a sleep.
        notes = list(connection.notifies(timeout=10, stop_after=1))
        assert [note.payload for note in notes] == ["hello"]
    assert proxy.connections == 1
    assert proxy.dropped == 0
    assert proxy.armed == 1


@needs_server
def test_a_dropped_commit_fails_the_client_although_the_row_landed(
    proxy: ReplyDroppingProxy, table: str
) -> None:
    proxy.drop_after_commit()
    with psycopg.connect(proxy.url) as connection:  # not autocommit: conn.commit() sends COMMIT
        connection.execute(f"INSERT INTO {table} VALUES (1, 'landed')")
        with pytest.raises(psycopg.OperationalError):
            connection.commit()
    assert ids(table) == [1], "the transaction committed on the server"
    assert proxy.dropped == 1
    assert proxy.dropped_replies[0].tags == ("COMMIT",)
    assert proxy.armed == 0
    assert proxy.open_connections == 0, "the proxy closed both sides"
    with psycopg.connect(proxy.url) as connection:  # back to pass-through
        connection.execute(f"INSERT INTO {table} VALUES (2, 'heard')")
        connection.commit()
    assert ids(table) == [1, 2]
    assert proxy.dropped == 1


@needs_server
def test_drop_after_commit_counts_transactions_and_spares_the_rest(
    proxy: ReplyDroppingProxy, table: str
) -> None:
    proxy.drop_after_commit(n=2)
    for key in (1, 2):
        with psycopg.connect(proxy.url, autocommit=True) as connection:
            # An explicit COMMIT over the extended protocol: psycopg sends a statement
            # without parameters as a simple Query unless it is prepared.
            connection.execute("BEGIN")
            connection.execute(f"INSERT INTO {table} VALUES (%s, 'x')", (key,))
            connection.execute("SELECT 1")  # replies before the COMMIT still arrive
            with pytest.raises(psycopg.OperationalError):
                connection.execute("COMMIT", prepare=True)
    with psycopg.connect(proxy.url, autocommit=True) as connection:
        connection.execute("BEGIN")
        connection.execute(f"INSERT INTO {table} VALUES (3, 'x')")
        connection.execute("COMMIT")
    assert ids(table) == [1, 2, 3]
    assert proxy.dropped == 2
    for dropped in proxy.dropped_replies:
        # BindComplete, NoData (the Describe), CommandComplete COMMIT, ReadyForQuery.
        assert [kind for kind, _ in dropped.messages] == ["2", "n", "C", "Z"]
        assert dropped.tags == ("COMMIT",)
    assert proxy.connections == 3


@needs_server
@pytest.mark.parametrize(
    "statement",
    [
        "INSERT INTO {table} VALUES (9, 'new')",
        "UPDATE {table} SET note = 'new' WHERE id = 9",
        "DELETE FROM {table} WHERE id = 9",
        # nous_session's commit: a data-modifying CTE whose tag is SELECT's.
        "WITH changed AS (UPDATE {table} SET note = 'new' WHERE id = 9 RETURNING id)"
        " SELECT id FROM changed",
    ],
    ids=["insert", "update", "delete", "cte"],
)
def test_drop_after_write_drops_a_single_autocommit_statement(
    proxy: ReplyDroppingProxy, table: str, statement: str
) -> None:
    if not statement.startswith("INSERT"):
        direct(f"INSERT INTO {table} VALUES (9, 'old')")
    proxy.drop_after_write()
    with psycopg.connect(proxy.url, autocommit=True) as connection:
        assert connection.execute("SELECT 1").fetchone() == (1,), "a read is not a write"
        with pytest.raises(psycopg.OperationalError):
            connection.execute(statement.format(table=table))
    after = direct(f"SELECT id, note FROM {table}")
    assert after == ([] if statement.startswith("DELETE") else [(9, "new")])
    assert proxy.dropped == 1
    assert proxy.dropped_replies[0].status == "I"


@needs_server
def test_drop_after_write_drops_a_pipelined_transaction(
    proxy: ReplyDroppingProxy, table: str
) -> None:
    proxy.drop_after_write()

    def piped(connection: Any) -> None:  # a psycopg.Connection
        with connection.pipeline(), connection.transaction():
            connection.execute(f"INSERT INTO {table} VALUES (%s, %s)", (1, "piped"))
            connection.execute(f"SELECT count(*) FROM {table}")

    with psycopg.connect(proxy.url, autocommit=True) as connection:
        with pytest.raises(psycopg.OperationalError):
            piped(connection)
    assert ids(table) == [1]
    (dropped,) = proxy.dropped_replies
    assert dropped.tags == ("COMMIT",)
    assert dropped.transaction[0] == "BEGIN"
    assert dropped.wrote


@needs_server
def test_drop_after_write_waits_for_the_end_of_the_transaction(
    proxy: ReplyDroppingProxy, table: str
) -> None:
    proxy.drop_after_write()
    with psycopg.connect(proxy.url) as connection:
        connection.execute(f"INSERT INTO {table} VALUES (1, 'a')")  # status T: not yet
        assert connection.execute(f"SELECT count(*) FROM {table}").fetchone() == (1,)
        assert proxy.dropped == 0
        with pytest.raises(psycopg.OperationalError):
            connection.commit()
    assert ids(table) == [1]
    assert proxy.dropped == 1


@needs_server
def test_drop_after_write_spares_reads_rollbacks_and_errors(
    proxy: ReplyDroppingProxy, table: str
) -> None:
    direct(f"INSERT INTO {table} VALUES (1, 'there')")
    proxy.drop_after_write()
    with psycopg.connect(proxy.url, autocommit=True) as connection:
        connection.execute(f"SELECT * FROM {table} FOR UPDATE")
        connection.execute("SELECT 'insert into x', 'update', 'delete'")
        with connection.transaction(force_rollback=True):
            connection.execute(f"INSERT INTO {table} VALUES (2, 'rolled back')")
        with pytest.raises(psycopg.errors.UniqueViolation):  # the error reaches the client
            connection.execute(f"INSERT INTO {table} VALUES (1, 'clash')")
        with pytest.raises(psycopg.errors.UniqueViolation):
            with connection.transaction():
                connection.execute(f"INSERT INTO {table} VALUES (1, 'clash')")
        assert proxy.dropped == 0
        assert proxy.armed == 1
        with pytest.raises(psycopg.OperationalError):
            connection.execute(f"INSERT INTO {table} VALUES (3, 'dropped')")
    assert ids(table) == [1, 3]


@needs_server
def test_drop_reply_matching_takes_any_predicate(proxy: ReplyDroppingProxy) -> None:
    proxy.drop_reply_matching(lambda reply: any("marker" in s for s in reply.statements))
    marked = "SELECT 'marker', %s::int"  # with a parameter: the extended protocol
    with psycopg.connect(proxy.url, autocommit=True) as connection:
        connection.execute("SELECT 1")
        with pytest.raises(psycopg.OperationalError):
            connection.execute(marked, (1,))
    with psycopg.connect(proxy.url, autocommit=True) as connection:
        assert connection.execute(marked, (2,)).fetchone() == ("marker", 2)
    (dropped,) = proxy.dropped_replies
    assert dropped.statements == ("SELECT 'marker', $1::int",)
    assert dropped.tags == ("SELECT 1",)
    assert [kind for kind, _ in dropped.messages] == ["1", "2", "T", "D", "C", "Z"]


@needs_server
def test_pass_through_disarms(proxy: ReplyDroppingProxy, table: str) -> None:
    proxy.drop_after_write(n=5)
    assert proxy.armed == 5
    proxy.pass_through()
    assert proxy.armed == 0
    with psycopg.connect(proxy.url, autocommit=True) as connection:
        connection.execute(f"INSERT INTO {table} VALUES (1, 'x')")
    assert proxy.dropped == 0
    with pytest.raises(ValueError, match="n must be"):
        proxy.drop_after_write(n=0)


@needs_server
def test_cut_all_closes_every_connection_and_new_ones_work(proxy: ReplyDroppingProxy) -> None:
    first = psycopg.connect(proxy.url, autocommit=True)
    second = psycopg.connect(proxy.url, autocommit=True)
    try:
        first.execute("SELECT 1")
        second.execute("SELECT 1")
        assert proxy.open_connections == 2
        assert proxy.cut_all() == 2
        assert proxy.open_connections == 0
        for connection in (first, second):
            with pytest.raises(psycopg.OperationalError):
                connection.execute("SELECT 1")
    finally:
        first.close()
        second.close()
    with psycopg.connect(proxy.url, autocommit=True) as connection:
        assert connection.execute("SELECT 1").fetchone() == (1,)
    assert proxy.cuts == 2
    assert proxy.connections == 3


@needs_server
@pytest.mark.anyio
async def test_the_proxy_serves_async_tests_on_either_event_loop(
    proxy: ReplyDroppingProxy, schema: str
) -> None:
    # One pooled connection, so that the load after the cut surely takes the cut one.
    async with PostgresStore(proxy.url, schema=schema, max_size=1) as store:
        await store.commit("s", expected_count=0, events=[make_event(0, "user_message", {})])
        assert [event.seq for event in await store.load("s")] == [0]
        assert await anyio.to_thread.run_sync(proxy.cut_all) == 1
        # The pool's connection was cut: a read tries once more on a new one (a read changes
        # nothing, so that is safe), and succeeds.
        assert [event.seq for event in await store.load("s")] == [0]
        assert proxy.connections >= 2


# terminate_backends ---------------------------------------------------------------------------


@needs_server
def test_terminate_backends_fails_the_next_query_on_a_pooled_connection() -> None:
    name = f"faultkit {uuid.uuid4().hex[:8]}"
    pool = psycopg_pool.ConnectionPool(
        URL,
        min_size=1,
        max_size=1,
        open=False,
        kwargs={"autocommit": True, "application_name": name},
    )
    pool.open(wait=True)
    try:
        with psycopg.connect(URL, autocommit=True, application_name="bystander") as bystander:
            with pool.connection() as connection:
                connection.execute("SELECT 1")
            assert terminate_backends(URL, application_name=name) == 1
            with pytest.raises(psycopg.OperationalError):
                with pool.connection() as connection:
                    connection.execute("SELECT 1")
            with pool.connection() as connection:  # the pool replaced the broken one
                assert connection.execute("SELECT 1").fetchone() == (1,)
            assert bystander.execute("SELECT 1").fetchone() == (1,), "others are spared"
            assert terminate_backends(f"{URL}?schema=ignored", application_name="none") == 0
    finally:
        pool.close()


# PostgresServer -------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def server() -> Iterator[PostgresServer]:
    with PostgresServer() as server:
        yield server


@needs_binaries
def test_terminate_backends_without_a_filter_ends_every_other_client(
    server: PostgresServer,
) -> None:
    first = psycopg.connect(server.url, autocommit=True)
    second = psycopg.connect(server.url, autocommit=True, application_name="other")
    try:
        assert terminate_backends(server.url) == 2
        for connection in (first, second):
            with pytest.raises(psycopg.OperationalError):
                connection.execute("SELECT 1")
    finally:
        first.close()
        second.close()


@needs_binaries
@pytest.mark.parametrize("mode", ["fast", "immediate"])
def test_a_restart_fails_open_connections_and_new_ones_work(
    server: PostgresServer, mode: str
) -> None:
    table = f"r_{mode}"
    with psycopg.connect(server.url, autocommit=True) as connection:
        connection.execute(f"CREATE TABLE {table} (n integer)")
        connection.execute(f"INSERT INTO {table} VALUES (1)")
        url = server.url
        server.restart(mode)
        assert server.url == url, "same port, same URL"
        with pytest.raises(psycopg.OperationalError):
            connection.execute("SELECT 1")
    assert direct(f"SELECT n FROM {table}", url=server.url) == [(1,)]
    server.stop()
    with pytest.raises(psycopg.OperationalError):
        psycopg.connect(server.url, connect_timeout=5)
    server.start()
    assert direct("SELECT 1", url=server.url) == [(1,)]


@needs_binaries
@pytest.mark.anyio
async def test_a_restart_under_a_running_store_and_a_proxy(server: PostgresServer) -> None:
    schema = f"t_{uuid.uuid4().hex[:16]}"
    with ReplyDroppingProxy(server.url) as proxy:
        async with PostgresStore(proxy.url, schema=schema, max_size=1) as store:
            await store.commit("s", expected_count=0, events=[make_event(0, "user_message", {})])
            await anyio.to_thread.run_sync(server.restart)
            # The pooled connection died with the server: the read tries once more, anew.
            assert [event.seq for event in await store.load("s")] == [0]
        assert proxy.errors == []


# The bug these tools are for ------------------------------------------------------------------


@pytest.fixture
async def stores(
    proxy: ReplyDroppingProxy, schema: str
) -> AsyncIterator[tuple[PostgresStore, PostgresStore]]:
    """A store through the proxy (one pooled connection) and one straight to the server."""
    async with PostgresStore(proxy.url, schema=schema, max_size=1) as faulty:
        async with PostgresStore(URL, schema=schema) as straight:
            yield faulty, straight


@needs_server
@pytest.mark.anyio
async def test_a_commit_whose_reply_is_lost_is_reported_as_unknown_not_failed(
    proxy: ReplyDroppingProxy, stores: tuple[PostgresStore, PostgresStore]
) -> None:
    """Issue 9 item 1, at the store: a StoreError means nothing was stored, so a commit whose
    reply was lost (it did land) must not raise one; it raises OutcomeUnknownError."""
    faulty, straight = stores
    assert list(await faulty.load("s")) == []  # connect and migrate before arming
    proxy.drop_after_write()
    event = make_event(0, "user_message", {"content": "did this land?"})
    with pytest.raises(OutcomeUnknownError, match="may or may not have landed"):
        await faulty.commit("s", expected_count=0, events=[event], commit_id="c-1")
    if proxy.dropped != 1:
        pytest.fail(f"the proxy dropped {proxy.dropped} replies, expected the commit's")
    assert [(e.seq, e.data["content"]) for e in await straight.load("s")] == [(0, "did this land?")]
    # The commit id says where it landed, and sending it again cannot land it twice.
    assert await straight.committed("s", "c-1") == (0, 1)
    with pytest.raises(ConflictError):
        await faulty.commit("s", expected_count=0, events=[event], commit_id="c-1")
    assert len(await straight.load("s")) == 1
