"""SQLiteStore beyond the conformance suite: crashes, faults, bad files, migrations, vacuum."""

from __future__ import annotations

import gc
import hashlib
import os
import random
import signal
import sqlite3
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

import anyio
import pytest

from nous_session import (
    ConflictError,
    CorruptRecordError,
    Log,
    Message,
    SessionActor,
    StoreError,
)
from nous_session.codec import encode
from nous_session.event import make_event
from nous_session.stores import open_store
from nous_session.stores.memory import MemoryStore
from nous_session.stores.sqlite import SCHEMA_VERSION, SQLiteStore
from nous_session.stores.sqlite import _commit as sqlite_commit
from nous_session.stores.sqlite import _rows as sqlite_rows
from nous_session.stores.sqlite import _schema as sqlite_schema
from nous_session.testing import sample_log
from tests.support.processes import check_shared_session, ending, run_writers

SUPPORT = Path(__file__).parent.parent / "support"
CRASHES = int(os.environ.get("NOUS_CRASH_ROUNDS", "20"))


def _crash_rounds(
    path: Path, rounds: int, seed: int, *args: str
) -> tuple[dict[str, dict[int, str]], int]:
    """Run crash_writer.py ``rounds`` times, each killed with SIGKILL after a random number of
    acknowledgements; after each kill, check every acknowledged event is stored byte-equal.

    Returns the acknowledged digests by session and seq, and the largest group the writer
    reported.
    """
    rng = random.Random(seed)
    acknowledged: dict[str, dict[int, str]] = {}
    max_group = 0

    def record(line: str) -> None:
        nonlocal max_group
        fields = line.split()
        if fields[0] == "group":
            max_group = max(max_group, int(fields[1]))
            return
        session_id = args[0] if len(fields) == 2 else fields[0]
        acknowledged.setdefault(session_id, {})[int(fields[-2])] = fields[-1]

    for _ in range(rounds):
        with (
            subprocess.Popen(
                [sys.executable, str(SUPPORT / "crash_writer.py"), str(path), *args],
                stdout=subprocess.PIPE,
                text=True,
            ) as child,
            ending(child),
        ):
            assert child.stdout is not None
            ready = child.stdout.readline()
            assert ready.startswith("ready"), ready
            # Let it run for a random number of acknowledgements, then kill it mid-flight.
            for _ in range(rng.randrange(1, 400)):
                line = child.stdout.readline()
                if not line:
                    break
                record(line)
            child.send_signal(signal.SIGKILL)
            for line in child.stdout:  # acknowledgements printed before the kill landed
                if line.strip():
                    record(line)
        assert child.returncode == -signal.SIGKILL

        for session_id, digests in acknowledged.items():
            stored = anyio.run(_load_all, path, session_id)
            by_seq = {event.seq: event for event in stored}
            assert [event.seq for event in stored] == list(range(len(stored))), (
                f"{session_id}: seqs must be contiguous"
            )
            for seq, digest in digests.items():
                assert seq in by_seq, f"acknowledged event {seq} of {session_id} was lost"
                assert hashlib.sha256(encode(by_seq[seq])).hexdigest() == digest
            log = Log.restore(stored)
            assert len(log.derive_messages()) == len(stored)  # the surface derives
    return acknowledged, max_group


def test_sigkill_never_loses_an_acknowledged_event(tmp_path: Path) -> None:
    """Kill a writer with SIGKILL at random moments: acknowledged events survive, byte-equal."""
    acknowledged, _ = _crash_rounds(tmp_path / "crash.sqlite3", CRASHES, 20261129, "crashy", "8")
    assert sum(map(len, acknowledged.values())) > CRASHES


def test_sigkill_during_group_commits_of_many_sessions_loses_nothing(tmp_path: Path) -> None:
    """Forty sessions on one store, two producers each, killed mid-flight again and again: the
    kills land while the writer group-commits many sessions' batches in one transaction, and
    every acknowledged event of every session survives, byte-equal."""
    acknowledged, max_group = _crash_rounds(
        tmp_path / "many.sqlite3", max(CRASHES // 2, 2), 20261202, "crowd", "2", "40"
    )
    assert len(acknowledged) > 20  # the acknowledgements came from many sessions
    assert sum(map(len, acknowledged.values())) > CRASHES
    assert max_group > 1, "the writer never put two sessions' commits in one transaction"


async def _load_all(path: Path, session_id: str) -> list:  # type: ignore[type-arg]
    async with SQLiteStore(path) as store:
        return list(await store.load(session_id))


async def _on_connection(store: SQLiteStore, sql: str) -> None:
    await store._run(lambda connection: connection.execute(sql))


@pytest.mark.anyio
@pytest.mark.parametrize(
    ("fault", "repair", "message"),
    [
        ("PRAGMA max_page_count = {pages}", "PRAGMA max_page_count = 1073741823", "full"),
        ("PRAGMA query_only = ON", "PRAGMA query_only = OFF", "readonly"),
    ],
    ids=["disk-full", "read-only"],
)
async def test_a_fault_fails_the_batch_and_the_session_recovers(
    tmp_path: Path, fault: str, repair: str, message: str
) -> None:
    async with SQLiteStore(tmp_path / "f.sqlite3") as store:
        async with SessionActor.open(session_id="s", store=store) as session:
            for index in range(20):
                await session.add_message(Message.user(f"before {index} " + "y" * 500))
            pages = await store._run(
                lambda connection: connection.execute("PRAGMA page_count").fetchone()[0]
            )
            await _on_connection(store, fault.format(pages=pages))
            with pytest.raises(StoreError, match=message):
                await session.append_many(
                    [("user_message", {"content": "z" * 5000}) for _ in range(40)]
                )
            # Memory equals the store: nothing of the failed batch is anywhere.
            assert list(session.log.events()) == list(await store.load("s"))
            assert session.log.count == 20
            await _on_connection(store, repair)
            event = await session.append("user_message", {"content": "after the fault"})
            assert event.seq == 20
            assert list(session.log.events()) == list(await store.load("s"))


@pytest.mark.anyio
async def test_a_locked_database_fails_the_batch_then_recovers(tmp_path: Path) -> None:
    path = tmp_path / "locked.sqlite3"
    async with SQLiteStore(path, busy_timeout=0.05) as store:
        async with SessionActor.open(session_id="s", store=store) as session:
            await session.append("user_message", {"content": "first"})
            other = sqlite3.connect(path, isolation_level=None)
            try:
                other.execute("BEGIN EXCLUSIVE")
                with pytest.raises(StoreError, match="locked"):
                    await session.append("user_message", {"content": "blocked"})
                other.execute("ROLLBACK")
            finally:
                other.close()
            assert (await session.append("user_message", {"content": "then"})).seq == 1
            assert [e.data["content"] for e in await store.load("s")] == ["first", "then"]


@pytest.mark.anyio
async def test_a_corrupted_row_names_itself_and_spoils_nothing_else(tmp_path: Path) -> None:
    path = tmp_path / "corrupt.sqlite3"
    async with SQLiteStore(path) as store:
        for sid in ("good", "bad"):
            async with SessionActor.open(session_id=sid, store=store) as session:
                for index in range(3):
                    await session.append("user_message", {"content": f"{sid} {index}"})
    raw = sqlite3.connect(path)
    raw.execute(
        "UPDATE nous_events SET record = ? WHERE seq = 1 AND sid ="
        " (SELECT id FROM nous_sessions WHERE name = 'bad')",
        (b'[1,1,"user_mess',),
    )
    raw.commit()
    raw.close()
    async with SQLiteStore(path) as store:
        with pytest.raises(CorruptRecordError, match=r"session 'bad' seq 1 .*truncated"):
            await store.load("bad")
        with pytest.raises(CorruptRecordError):
            async with SessionActor.open(session_id="bad", store=store):
                pass
        assert [e.data["content"] for e in await store.load("good")] == [
            "good 0",
            "good 1",
            "good 2",
        ]


@pytest.mark.anyio
async def test_a_newer_schema_is_refused_with_a_clear_error(tmp_path: Path) -> None:
    path = tmp_path / "future.sqlite3"
    async with SQLiteStore(path) as store:
        await store.sessions()
    raw = sqlite3.connect(path)
    raw.execute("UPDATE nous_schema SET version = ?", (SCHEMA_VERSION + 1,))
    raw.commit()
    raw.close()
    async with SQLiteStore(path) as store:
        with pytest.raises(StoreError, match="newer than this nous_session"):
            await store.load("s")


@pytest.mark.anyio
async def test_an_empty_version_zero_file_is_migrated(tmp_path: Path) -> None:
    path = tmp_path / "old.sqlite3"
    raw = sqlite3.connect(path)
    raw.execute("CREATE TABLE nous_schema (version INTEGER NOT NULL)")
    raw.execute("INSERT INTO nous_schema VALUES (0)")
    raw.commit()
    raw.close()
    async with SQLiteStore(path) as store:
        async with SessionActor.open(session_id="s", store=store) as session:
            await session.append("user_message", {"content": "hello"})
    raw = sqlite3.connect(path)
    assert raw.execute("SELECT version FROM nous_schema").fetchall() == [(SCHEMA_VERSION,)]
    raw.close()


@pytest.mark.anyio
async def test_a_file_that_is_not_a_database_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "notes.txt"
    path.write_bytes(b"these are my notes, not a database" * 100)
    async with SQLiteStore(path) as store:
        with pytest.raises(StoreError, match="cannot open"):
            await store.sessions()
    assert path.read_bytes().startswith(b"these are my notes")


@pytest.mark.anyio
async def test_snapshot_deletes_rows_and_vacuum_shrinks_the_file(tmp_path: Path) -> None:
    path = tmp_path / "big.sqlite3"
    async with SQLiteStore(path) as store:
        async with SessionActor.open(session_id="s", store=store) as session:
            await session.append_many(
                [("user_message", {"content": f"{i} " + "w" * 400}) for i in range(2000)]
            )
            await session.replace(0, 999, Message.system("the first thousand, summarised"))
            await store._run(lambda c: c.execute("PRAGMA wal_checkpoint(TRUNCATE)"))
            before = path.stat().st_size
            log = await session.snapshot()
            assert len(log.events()) == 1001
            assert len(await store.load("s")) == 1001
        await store.vacuum()
    assert path.stat().st_size < 0.6 * before
    async with (
        SQLiteStore(path) as store,
        SessionActor.open(session_id="s", store=store) as session,
    ):
        assert session.log.count == 2001
        assert session.messages()[0].text == "the first thousand, summarised"


def test_four_processes_share_one_sqlite_session(tmp_path: Path) -> None:
    """Processes clash on one session in one file: ConflictError, catch up, retry; nothing lost."""
    url = f"sqlite:///{tmp_path / 'shared.sqlite3'}"
    acks = run_writers(url, "shared", writers=4, producers=5, each=30)
    stored = [
        (e.seq, str(e.data["content"]))
        for e in anyio.run(_load_all, tmp_path / "shared.sqlite3", "shared")
    ]
    check_shared_session(acks, stored, producers=5, each=30)


def test_open_store_picks_the_backend_from_the_url(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    assert isinstance(open_store("memory:"), MemoryStore)
    store = open_store(f"sqlite:///{tmp_path}/a.sqlite3")
    assert isinstance(store, SQLiteStore)
    assert store.path == f"{tmp_path}/a.sqlite3"
    assert isinstance(open_store("sqlite:///relative.sqlite3"), SQLiteStore)
    monkeypatch.setenv("NOUS_SESSION_STORE", "memory:")
    assert isinstance(open_store(), MemoryStore)
    monkeypatch.setenv("NOUS_SESSION_STORE", f"sqlite:///{tmp_path}/named.sqlite3")
    named = open_store()
    assert isinstance(named, SQLiteStore)
    assert named.path == f"{tmp_path}/named.sqlite3"
    # Named nowhere: memory, as SessionActor.open() with no store.
    monkeypatch.delenv("NOUS_SESSION_STORE")
    assert isinstance(open_store(), MemoryStore)


@pytest.mark.parametrize(
    ("url", "message"),
    [
        ("ftp://example.com/x", "unknown store URL scheme 'ftp'"),
        ("sessions.db", "no scheme"),
        ("sqlite:/x.db", "sqlite:///relative/path"),
        ("sqlite:///", "sqlite:///relative/path"),
        ("memory:/somewhere", "takes no path"),
    ],
)
def test_open_store_refuses_bad_urls_clearly(url: str, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        open_store(url)


def test_an_unclosed_store_warns(tmp_path: Path) -> None:
    async def leak() -> None:
        store = SQLiteStore(tmp_path / "leak.sqlite3")
        await store.sessions()

    def leak_and_collect() -> None:
        anyio.run(leak)
        gc.collect()

    with pytest.warns(ResourceWarning, match="was not closed"):
        leak_and_collect()
    # The abandoned writer ends by itself once it has committed what it was sent, without
    # being joined: wait for that here, or the next test may find it still running.
    for thread in threading.enumerate():
        if thread.name.startswith("nous_session-sqlite-writer"):
            thread.join(timeout=30)
            assert not thread.is_alive(), f"{thread.name} did not end after being abandoned"


def test_switching_to_wal_waits_for_another_process_like_the_busy_handler(tmp_path: Path) -> None:
    """SQLite answers ``journal_mode=WAL`` with SQLITE_BUSY without calling its busy handler
    while another connection converts or opens the same new file: the store retries until
    ``busy_timeout``. Here a connection with no busy handler of its own stands in for that
    case, and the other side holds the file locked through two attempts."""
    path = tmp_path / "new.sqlite3"
    holder = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
    holder.execute("BEGIN EXCLUSIVE")
    attempts: list[str] = []

    class Counting(sqlite3.Connection):
        def execute(self, sql: str, *args: Any) -> sqlite3.Cursor:
            if sql == "PRAGMA journal_mode=WAL":
                attempts.append(sql)
                if len(attempts) == 3:
                    holder.execute("COMMIT")
            return super().execute(sql, *args)

    connection = sqlite3.connect(path, timeout=0, isolation_level=None, factory=Counting)
    try:
        sqlite_schema.enable_wal(connection, busy_timeout=30)
        assert len(attempts) == 3
        assert connection.execute("PRAGMA journal_mode").fetchone() == ("wal",)
    finally:
        connection.close()
        holder.close()


def test_switching_to_wal_gives_up_at_the_busy_timeout(tmp_path: Path) -> None:
    path = tmp_path / "new.sqlite3"
    holder = sqlite3.connect(path, isolation_level=None)
    holder.execute("BEGIN EXCLUSIVE")
    connection = sqlite3.connect(path, timeout=0, isolation_level=None)
    try:
        with pytest.raises(sqlite3.OperationalError, match="locked"):
            sqlite_schema.enable_wal(connection, busy_timeout=0.05)
    finally:
        connection.close()
        holder.execute("COMMIT")
        holder.close()


def _raw(path: Path, statement: str, *params: object) -> list[tuple[Any, ...]]:
    raw = sqlite3.connect(path)
    try:
        rows = raw.execute(statement, params).fetchall()
        raw.commit()
    finally:
        raw.close()
    return rows


_SID_OF_S = "(SELECT id FROM nous_sessions WHERE name = 's')"


@pytest.mark.anyio
async def test_a_row_missing_from_the_middle_is_named_on_read(tmp_path: Path) -> None:
    path = tmp_path / "holes.sqlite3"
    async with SQLiteStore(path) as store:
        await store.commit("s", expected_count=0, events=sample_log(5).events())
    _raw(path, f"DELETE FROM nous_events WHERE seq = 2 AND sid = {_SID_OF_S}")
    async with SQLiteStore(path) as store:
        for read in (store.read, store.load):
            with pytest.raises(
                CorruptRecordError, match=r"'s' in .*: its count is 5 .*rows are missing: seqs 2 \("
            ):
                await read("s")
        # Past the hole, what is held is whole.
        assert [e.seq for e in await store.load("s", since=3)] == [3, 4]
        with pytest.raises(CorruptRecordError, match=r"rows are missing: seqs 2 "):
            async with SessionActor.open(session_id="s", store=store):
                pass


@pytest.mark.anyio
async def test_a_rebase_never_writes_past_a_hole(tmp_path: Path) -> None:
    path = tmp_path / "holes.sqlite3"
    async with SQLiteStore(path) as store:
        await store.commit("s", expected_count=0, events=sample_log(3).events())
    # The count moved with no rows written: seqs 3..9 are missing.
    _raw(path, "UPDATE nous_sessions SET count = 10 WHERE name = 's'")
    async with SQLiteStore(path) as store:
        mine = [make_event(3, "user_message", {"content": "mine"})]
        with pytest.raises(CorruptRecordError, match=r"rows are missing: seqs 3\.\.9 "):
            await store.commit_rebased("s", expected_count=3, events=mine)
        with pytest.raises(CorruptRecordError, match=r"rows are missing: seqs 3\.\.9 "):
            await store.read("s")
    assert _raw(path, f"SELECT seq FROM nous_events WHERE sid = {_SID_OF_S}") == [(0,), (1,), (2,)]
    assert _raw(path, "SELECT count FROM nous_sessions WHERE name = 's'") == [(10,)]


@pytest.mark.anyio
async def test_a_failed_read_leaves_no_transaction_open_on_either_read_path(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A read opens a transaction (one snapshot for the count and the rows); a query failing
    # inside it must not leave the connection holding it: the writer thread rolls back what a
    # read left open, and so does a read-only store's own path.
    path = tmp_path / "s.sqlite3"
    events = [make_event(seq, "user_message", {"content": f"m{seq}"}) for seq in range(3)]
    writer = SQLiteStore(path)
    reader = SQLiteStore(path, read_only=True)
    try:
        await writer.commit("s", expected_count=0, events=events)
        rows = sqlite_rows.view
        failing = {"on": True}

        def flaky(*args: Any, **kwargs: Any) -> Any:
            if failing["on"]:
                raise sqlite3.OperationalError("disk I/O error")
            return rows(*args, **kwargs)

        monkeypatch.setattr(sqlite_rows, "view", flaky)
        for store in (writer, reader):
            with pytest.raises(StoreError, match="disk I/O error"):
                await store.load("s")
        failing["on"] = False
        for store in (writer, reader):
            assert [event.seq for event in await store.load("s")] == [0, 1, 2]
        assert reader._connection is None or not reader._connection.in_transaction
        await writer.commit("s", expected_count=3, events=[make_event(3, "user_message", {})])
    finally:
        await reader.aclose()
        await writer.aclose()


@pytest.mark.anyio
@pytest.mark.parametrize("read_only", [False, True], ids=["writer-thread", "read-only"])
async def test_a_commit_between_the_count_and_the_rows_is_not_seen_by_the_read(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, read_only: bool
) -> None:
    # The deterministic form of the conformance suite's racing-load test: another process
    # commits exactly between a read's query of the session row (its count) and its query of
    # the rows. Read in one snapshot, the read sees the session as it was before that commit;
    # read in two, it would see a row past the count and call the whole session corrupt.
    path = tmp_path / "s.sqlite3"
    events = [make_event(seq, "user_message", {"content": f"m{seq}"}) for seq in range(2)]
    late = make_event(2, "user_message", {"content": "late"})
    writer = SQLiteStore(path)
    reader = SQLiteStore(path, read_only=True) if read_only else writer
    try:
        await writer.commit("s", expected_count=0, events=events)
        rows = sqlite_rows.view
        between = {"on": True}

        def another_process_commits_first(
            connection: sqlite3.Connection, row: Any, *args: Any
        ) -> Any:
            if between["on"]:
                between["on"] = False
                other = sqlite3.connect(path, isolation_level=None)
                try:
                    other.execute("BEGIN IMMEDIATE")
                    other.execute(
                        "INSERT INTO nous_events (sid, seq, record) VALUES (?, 2, ?)",
                        (row.key, encode(late)),
                    )
                    other.execute(
                        "UPDATE nous_sessions SET count = 3, held = held + 1 WHERE id = ?",
                        (row.key,),
                    )
                    other.execute("COMMIT")
                finally:
                    other.close()
            return rows(connection, row, *args)

        monkeypatch.setattr(sqlite_rows, "view", another_process_commits_first)
        assert [event.seq for event in await reader.load("s")] == [0, 1]
        assert not between["on"]  # the commit did land between the two queries
        # The next read sees it, whole.
        assert [event.seq for event in await reader.load("s")] == [0, 1, 2]
        between["on"] = True
        _raw(path, f"DELETE FROM nous_events WHERE seq = 2 AND sid = {_SID_OF_S}")
        _raw(path, "UPDATE nous_sessions SET count = 2, held = held - 1 WHERE name = 's'")
        stored = await reader.read("s")
        assert ([event.seq for event in stored.events], stored.count) == ([0, 1], 2)
        assert not between["on"]
    finally:
        if reader is not writer:
            await reader.aclose()
        await writer.aclose()


def _said(seq: int, text: str) -> tuple[Any, ...]:
    return (make_event(seq, "user_message", {"content": text}),)


@pytest.mark.anyio
async def test_a_commit_never_moves_the_session_that_took_a_deleted_sessions_id(
    tmp_path: Path,
) -> None:
    # The store keeps the ids of the sessions it writes; a deleted session's id is given to
    # the next new session (SQLite reuses the highest rowid), so the kept id alone would name
    # that other session's row.
    path = tmp_path / "ids.sqlite3"
    async with SQLiteStore(path) as store:
        for name in ("a", "b"):
            await store.commit(name, expected_count=0, events=_said(0, f"{name} 0"))
            await store.commit(name, expected_count=1, events=_said(1, f"{name} 1"))
        [(b_id,)] = _raw(path, "SELECT id FROM nous_sessions WHERE name = 'b'")
        assert await store.delete("b")
        await store.commit("c", expected_count=0, events=_said(0, "c 0"))
        await store.commit("c", expected_count=1, events=_said(1, "c 1"))
        assert _raw(path, "SELECT id, count FROM nous_sessions WHERE name = 'c'") == [(b_id, 2)]
        # "b" is gone: at c's count, a commit to it conflicts and leaves c as it was.
        with pytest.raises(ConflictError, match="has count 0, expected 2"):
            await store.commit("b", expected_count=2, events=_said(2, "b 2"))
        assert [e.data["content"] for e in await store.load("c")] == ["c 0", "c 1"]
        assert _raw(path, "SELECT count, held FROM nous_sessions WHERE name = 'c'") == [(2, 2)]
        assert _raw(path, "SELECT count(*) FROM nous_sessions WHERE name = 'b'") == [(0,)]


@pytest.mark.anyio
async def test_a_session_made_again_by_another_store_is_written_where_it_now_is(
    tmp_path: Path,
) -> None:
    path = tmp_path / "ids.sqlite3"
    async with SQLiteStore(path) as mine, SQLiteStore(path) as other:
        await mine.commit("s", expected_count=0, events=_said(0, "old 0"))
        await mine.commit("s", expected_count=1, events=_said(1, "old 1"))
        [(old_id,)] = _raw(path, f"SELECT {_SID_OF_S}")
        assert await other.delete("s")
        await other.commit("x", expected_count=0, events=_said(0, "x 0"))
        await other.commit("s", expected_count=0, events=_said(0, "new 0"))
        [(new_id,)] = _raw(path, f"SELECT {_SID_OF_S}")
        assert new_id != old_id
        await mine.commit("s", expected_count=1, events=_said(1, "new 1"))
        await mine.commit("s", expected_count=2, events=_said(2, "new 2"))
        assert [e.data["content"] for e in await mine.load("s")] == ["new 0", "new 1", "new 2"]
        assert [e.data["content"] for e in await mine.load("x")] == ["x 0"]
        assert _raw(path, "SELECT name, count, held FROM nous_sessions ORDER BY name") == [
            ("s", 3, 3),
            ("x", 1, 1),
        ]


@pytest.mark.anyio
async def test_the_session_ids_a_store_keeps_are_bounded(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(sqlite_commit, "_IDS_AT_MOST", 2)
    async with SQLiteStore(tmp_path / "ids.sqlite3") as store:
        for round_ in range(3):
            for name in ("a", "b", "c"):
                await store.commit(name, expected_count=round_, events=_said(round_, name))
                assert len(store._ids) <= 2
        for name in ("a", "b", "c"):
            assert [e.data["content"] for e in await store.load(name)] == [name] * 3
