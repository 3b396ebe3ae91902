"""Suite "stores": SQLiteStore on a temporary file, against issue 4's performance targets.

Everything runs with the store's default durability (``synchronous=FULL`` in WAL mode: every
commit fsyncs the WAL), on asyncio, with structlog filtering at info.

* ``producers``: 50 concurrent producers through a SessionActor on SQLiteStore vs raw
  ``sqlite3`` inserting the same encoded rows in transactions of 50 (same WAL and FULL), side
  by side in slices; appends/s, the ratio, and the mean batch per commit.
* ``open_session``: ``SessionActor.open`` of a 100,000-event session (until it yields) vs a raw
  ``SELECT`` of its records and ``orjson.loads`` of each; every side on a fresh connection to
  the same file, order alternating.
* ``snapshot``: ``await session.snapshot()`` of a session with half of its events shadowed, at
  10,000 vs 100,000 events; and the file's size before vs after ``await store.vacuum()``.
* ``bytes_per_message``: the file size per stored message for 10,000 ~200-byte chat messages
  (for issue 6).
"""

from __future__ import annotations

import os
import shutil
import sqlite3
import statistics
import tempfile
import time
from collections.abc import AsyncIterator, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import anyio
import orjson

from benchmarks.harness import (
    AsyncSide,
    Context,
    Measurement,
    Target,
    ainterleave,
    ainterleave_slices,
    expect,
    measure,
    ratio,
)
from benchmarks.workloads import chat_messages, content
from nous_session import Event, EventType, Log, SessionActor
from nous_session.codec import decode, encode
from nous_session.stores.sqlite import SQLiteStore

ISSUE_4 = "issue 4"
ISSUE_6 = "issue 6"
USER = EventType.USER_MESSAGE
MS = 1e3
PRODUCERS = 50
RAW_TRANSACTION = 50  # rows per raw transaction, as issue 4 asks

# The SQLiteStore's events table, for the raw side of the comparisons.
RAW_SCHEMA = """CREATE TABLE nous_events (
    sid    INTEGER NOT NULL,
    seq    INTEGER NOT NULL,
    record BLOB NOT NULL,
    PRIMARY KEY (sid, seq)
) WITHOUT ROWID"""
SELECT_SESSION = (
    "SELECT e.seq, e.record FROM nous_events e JOIN nous_sessions s ON s.id = e.sid"
    " WHERE s.name = ? AND e.seq >= ? ORDER BY e.seq"
)


@contextmanager
def _directory() -> Iterator[Path]:
    """A temporary directory for the suite's files, on the machine's temp file system."""
    with tempfile.TemporaryDirectory(prefix="nous-bench-stores-") as name:
        yield Path(name)


def _raw_connection(path: Path) -> sqlite3.Connection:
    """A plain sqlite3 connection with the store's durability: WAL, synchronous=FULL."""
    connection = sqlite3.connect(path, isolation_level=None)
    mode = connection.execute("PRAGMA journal_mode=WAL").fetchone()[0]
    expect(mode == "wal", f"raw side: journal_mode is {mode}, not wal")
    connection.execute("PRAGMA synchronous=FULL")
    expect(
        connection.execute("PRAGMA synchronous").fetchone()[0] == 2,
        "raw side: not synchronous=FULL",
    )
    return connection


def _checkpoint(path: Path) -> None:
    """Fold the WAL into the database file and truncate it, from a connection of our own."""
    connection = sqlite3.connect(path, isolation_level=None)
    try:
        busy, _, _ = connection.execute("PRAGMA wal_checkpoint(TRUNCATE)").fetchone()
    finally:
        connection.close()
    expect(busy == 0, f"{path.name}: the WAL checkpoint was blocked")


def _rows(path: Path) -> int:
    """How many event rows the file holds."""
    connection = sqlite3.connect(path)
    try:
        return int(connection.execute("SELECT count(*) FROM nous_events").fetchone()[0])
    finally:
        connection.close()


def _file_bytes(path: Path) -> int:
    """The database file plus its WAL (if any)."""
    wal = path.with_name(path.name + "-wal")
    return path.stat().st_size + (wal.stat().st_size if wal.exists() else 0)


def _stored_events(path: Path, session_id: str, since: int = 0) -> list[Event]:
    """A session's stored events from ``since``, read and decoded with a connection of ours."""
    connection = sqlite3.connect(path)
    try:
        rows = connection.execute(SELECT_SESSION, (session_id, since)).fetchall()
    finally:
        connection.close()
    return [decode(record) for _, record in rows]


# Concurrent producers vs raw sqlite3 --------------------------------------------------------


async def _producers(ctx: Context, directory: Path) -> dict[str, list[float]]:
    slices, per_slice = ctx.size(10, 5), ctx.size(20, 10)  # appends per producer per slice
    per_round = PRODUCERS * per_slice * slices
    payloads = [{"content": content(k)} for k in range(PRODUCERS)]
    # The raw side's rows: the records of the same events (the producers' payloads, in the
    # order a batch takes them, at the same seqs), encoded by the codec once, outside the
    # timing. Both sides write one session (one sid) that grows round by round.
    log = Log()
    for index in range(per_round * ctx.rounds):
        log = log.append(USER, payloads[index % PRODUCERS])
    records = [(1, event.seq, encode(event)) for event in log.events()]
    del log
    raw_path = directory / "raw-producers.sqlite3"
    raw = _raw_connection(raw_path)
    raw.execute(RAW_SCHEMA)
    store_path = directory / "producers.sqlite3"
    batches: list[float] = []
    raw_rounds = [0]

    async with (
        SQLiteStore(store_path) as store,
        SessionActor.open(session_id="producers", store=store) as session,
    ):

        async def actor_side() -> AsyncIterator[float | None]:
            acked: list[list[Event]] = [[] for _ in range(PRODUCERS)]

            async def produce(k: int) -> None:
                out, data = acked[k], payloads[k]
                for _ in range(per_slice):
                    out.append(await session.append(USER, data))

            before = session.statistics()
            yield None
            for _ in range(slices):
                start = time.perf_counter()
                async with anyio.create_task_group() as task_group:
                    for k in range(PRODUCERS):
                        task_group.start_soon(produce, k)
                yield time.perf_counter() - start
            after = session.statistics()
            committed = after.batches - before.batches
            expect(after.count == before.count + per_round, "producers: appends went missing")
            expect(
                committed > 0 and after.requests - before.requests == per_round, "bad statistics"
            )
            batches.append(per_round / committed)
            stored = _stored_events(store_path, "producers", before.count)
            expect(
                [event.seq for event in stored] == list(range(before.count, after.count)),
                "producers: the file does not hold each new seq once",
            )
            for k, events in enumerate(acked):
                seqs = [event.seq for event in events]
                expect(len(seqs) == slices * per_slice, f"producer {k}: {len(seqs)} acks")
                expect(seqs == sorted(seqs), f"producer {k}: its order was not kept")
                for event in events:
                    expect(
                        stored[event.seq - before.count] == event and event.data == payloads[k],
                        f"producer {k}: acknowledged event {event.seq} is not the stored one",
                    )

        async def raw_side() -> AsyncIterator[float | None]:
            first = raw_rounds[0] * per_round
            raw_rounds[0] += 1
            rows = records[first : first + per_round]
            chunks = [rows[i : i + RAW_TRANSACTION] for i in range(0, len(rows), RAW_TRANSACTION)]
            per = len(chunks) // slices
            yield None
            for index in range(slices):
                start = time.perf_counter()
                for chunk in chunks[index * per : (index + 1) * per]:
                    raw.execute("BEGIN")
                    raw.executemany("INSERT INTO nous_events VALUES (?, ?, ?)", chunk)
                    raw.execute("COMMIT")
                yield time.perf_counter() - start
            stored = raw.execute(
                "SELECT sid, seq, record FROM nous_events WHERE sid = 1 AND seq >= ? ORDER BY seq",
                (first,),
            ).fetchall()
            expect(stored == rows, "raw side: the rows read back differ")

        samples = await ainterleave_slices(
            ctx.rounds,
            {"ours": AsyncSide(actor_side, slices), "raw": AsyncSide(raw_side, slices)},
        )
    raw.close()
    return {
        "ours": [per_round / s for s in samples["ours"]],
        "raw": [per_round / s for s in samples["raw"]],
        "batch": batches,
    }


def producers(ctx: Context) -> list[Measurement]:
    """50 producers through a SessionActor on SQLiteStore vs raw sqlite3, 50 rows a commit."""
    with _directory() as directory:
        rows = anyio.run(_producers, ctx, directory, backend="asyncio")
    return [
        measure(
            "stores.producers.rate",
            "appends/s",
            rows["ours"],
            target=Target(">=", 20_000, ISSUE_4),
            note="50 producers each awaiting `append(USER_MESSAGE, {content: 200 B})` through "
            "a SessionActor on SQLiteStore (temp file, WAL, synchronous=FULL), a fresh session "
            "per round; every ack checked against the file, per-producer order checked",
        ),
        measure(
            "stores.producers.raw_rate",
            "rows/s",
            rows["raw"],
            note="plain sqlite3 in one thread, same WAL + synchronous=FULL, the same table "
            "shape: BEGIN / executemany 50 rows / COMMIT, rows pre-encoded with "
            "nous_session.codec.encode from the same payloads (encoding not timed)",
        ),
        ratio(
            "stores.producers.ratio",
            rows["ours"],
            rows["raw"],
            target=Target(">=", 0.25, ISSUE_4),
            note="our appends/s / raw rows/s; the sides alternate in slices of 1,000 rows "
            "(50 producers x 20 appends / 20 transactions of 50) within each round",
        ),
        measure(
            "stores.producers.mean_batch",
            "requests/commit",
            rows["batch"],
            note="statistics().requests / statistics().batches over the round",
        ),
    ]


# Opening a session vs reading its rows raw -----------------------------------------------


def _chat_events(count: int) -> list[Event]:
    """``count`` chat events (the shared workload: user/assistant turns with tool calls)."""
    events = list(Log.seed(chat_messages(count)).events())
    expect(len(events) == count, f"the workload made {len(events)} events, not {count}")
    return events


async def _write_session(path: Path, session_id: str, events: Sequence[Event]) -> None:
    """Store ``events`` (seqs from 0, or with gaps) in chunks, then fold the WAL into the file."""
    async with SQLiteStore(path) as store:
        count, chunk = 0, 10_000
        for index in range(0, len(events), chunk):
            part = events[index : index + chunk]
            await store.commit(session_id, expected_count=count, events=part)
            count = part[-1].seq + 1
    _checkpoint(path)


async def _open(ctx: Context, directory: Path) -> dict[str, list[float]]:
    size = ctx.size(100_000, 20_000)
    session_id = "open"
    events = _chat_events(size)
    path = directory / "open.sqlite3"
    await _write_session(path, session_id, events)

    async def ours() -> float:
        start = time.perf_counter()
        async with (
            SQLiteStore(path) as store,
            SessionActor.open(session_id=session_id, store=store) as session,
        ):
            elapsed = time.perf_counter() - start
            log = session.log
        expect(log.count == size and log.events() == events, "open: the log is not the stored one")
        return elapsed

    async def raw() -> float:
        start = time.perf_counter()
        connection = sqlite3.connect(path)
        try:
            rows = connection.execute(SELECT_SESSION, (session_id, 0)).fetchall()
            values = [orjson.loads(record) for _, record in rows]
        finally:
            connection.close()
        elapsed = time.perf_counter() - start
        expect(len(values) == size, f"raw open: {len(values)} rows, not {size}")
        expect(
            all(value[1] == seq for (seq, _), value in zip(rows, values, strict=True)),
            "raw open: a record holds the wrong seq",
        )
        return elapsed

    samples = await ainterleave(ctx.rounds, {"ours": ours, "raw": raw})
    return {key: [s * MS for s in values] for key, values in samples.items()}


def open_session(ctx: Context) -> list[Measurement]:
    """``SessionActor.open`` of a 100,000-event SQLite session vs reading its rows raw."""
    with _directory() as directory:
        rows = anyio.run(_open, ctx, directory, backend="asyncio")
    size = ctx.size(100_000, 20_000)
    return [
        measure(
            "stores.open_session.ours",
            "ms",
            rows["ours"],
            note=f"`SessionActor.open(store=SQLiteStore(path))` of a {size:,}-event chat session "
            "until it yields: connect, schema check, SELECT, decode + validate every record, "
            "Log.restore, start the actor; a fresh store (connection) each time",
        ),
        measure(
            "stores.open_session.raw",
            "ms",
            rows["raw"],
            note="sqlite3.connect + the store's SELECT of the records + orjson.loads of each, "
            "in one thread; the same file, a fresh connection each time",
        ),
        ratio(
            "stores.open_session.ratio",
            rows["ours"],
            rows["raw"],
            target=Target("<=", 2, ISSUE_4),
            note="ours / raw; the sides alternate by round (the OS page cache is warm for both: "
            "the file was written and read just before)",
        ),
    ]


# Snapshot of a half-shadowed session, and VACUUM -------------------------------------------


BLOCK = 100  # per block: 99 chat messages, then a summary replacing the first 50 of them
SHADOWED = 50


def _half_shadowed(count: int) -> list[Event]:
    """``count`` events in which exactly half are shadowed.

    Each block of 100 seqs is 99 user/assistant messages and a summary (a system message with
    ``surface_op: ["replace", s, s + 49]``) over the block's first 50: those 50 are shadowed,
    the other 49 and the summary stay on the surface.
    """
    expect(count % BLOCK == 0, "the size must be a whole number of blocks")
    log = Log()
    for block in range(count // BLOCK):
        start = block * BLOCK
        for index in range(start, start + BLOCK - 1):
            kind = EventType.USER_MESSAGE if index % 2 == 0 else EventType.ASSISTANT_MESSAGE
            log = log.append(kind, {"content": content(index)})
        summary = {
            "content": f"[Compacted {SHADOWED} earlier messages] " + content(start, 180),
            "surface_op": ["replace", start, start + SHADOWED - 1],
        }
        log = log.append(EventType.SYSTEM_MESSAGE, summary)
    expect(len(log.shadowed()) == count // 2, "half of the events must be shadowed")
    return list(log.events())


async def _snapshot(ctx: Context, directory: Path) -> dict[str, list[float]]:
    small, large = ctx.size(10_000, 5_000), ctx.size(100_000, 50_000)
    templates: dict[int, Path] = {}
    for size in (small, large):
        templates[size] = directory / f"snapshot-{size}.sqlite3"
        await _write_session(templates[size], "snapshot", _half_shadowed(size))
    out: dict[str, list[float]] = {
        key: [] for key in ("small", "large", "before", "after", "vacuum_ms")
    }
    copies = [0]

    async def run(size: int) -> None:
        copies[0] += 1
        path = directory / f"copy-{copies[0]}.sqlite3"
        shutil.copyfile(templates[size], path)
        async with (
            SQLiteStore(path) as store,
            SessionActor.open(session_id="snapshot", store=store) as session,
        ):
            # A live session has derived its messages already (the agent reads them every
            # turn): the fold is warm, so the figure is the snapshot's own work.
            surface = len(session.messages())
            start = time.perf_counter()
            log = await session.snapshot()
            elapsed = time.perf_counter() - start
            expect(
                log.count == size and len(log.events()) == size // 2 and not log.shadowed(),
                "snapshot: the log does not hold exactly the live half",
            )
            expect(len(session.messages()) == surface, "snapshot: the surface changed")
            expect(_rows(path) == size // 2, "snapshot: the file does not hold the live half")
            out["small" if size == small else "large"].append(elapsed * MS)
            if size == large:
                _checkpoint(path)
                out["before"].append(_file_bytes(path))
                start = time.perf_counter()
                await store.vacuum()
                out["vacuum_ms"].append((time.perf_counter() - start) * MS)
                out["after"].append(_file_bytes(path))
                expect(
                    [event.seq for event in await store.load("snapshot")]
                    == [event.seq for event in log.events()],
                    "vacuum: the stored events changed",
                )
        os.remove(path)

    for round_index in range(ctx.rounds):
        sizes = (small, large) if round_index % 2 == 0 else (large, small)
        for size in sizes:
            await run(size)
    return out


def snapshot(ctx: Context) -> list[Measurement]:
    """``await session.snapshot()`` at 10k vs 100k half-shadowed events; VACUUM's gain."""
    with _directory() as directory:
        rows = anyio.run(_snapshot, ctx, directory, backend="asyncio")
    small, large = ctx.size(10_000, 5_000), ctx.size(100_000, 50_000)
    mb = 1 / 2**20
    return [
        measure(
            f"stores.snapshot.at_{small // 1000}k",
            "ms",
            rows["small"],
            note=f"`await session.snapshot()` of a {small:,}-event SQLite session in which half "
            "the events are shadowed (per 100 seqs: 99 chat messages and a summary replacing "
            "the first 50), dropping them in memory and in the file in one commit; the fold "
            "is warm (messages() derived before); a fresh copy of the file per round",
        ),
        measure(f"stores.snapshot.at_{large // 1000}k", "ms", rows["large"]),
        ratio(
            "stores.snapshot.ratio",
            rows["large"],
            rows["small"],
            target=Target("<=", 12, ISSUE_4),
            note="10x the events; linear is 10 (sizes alternate by round)",
        ),
        measure(
            "stores.snapshot.file_before_vacuum",
            "MiB",
            [b * mb for b in rows["before"]],
            note=f"the {large:,}-event file after the snapshot, WAL checkpointed (TRUNCATE)",
        ),
        measure("stores.snapshot.file_after_vacuum", "MiB", [a * mb for a in rows["after"]]),
        ratio(
            "stores.snapshot.vacuum_fraction",
            rows["after"],
            rows["before"],
            target=Target("<=", 0.6, ISSUE_4),
            note="file size after `await store.vacuum()` / before",
        ),
        measure("stores.snapshot.vacuum_time", "ms", rows["vacuum_ms"]),
    ]


# Bytes on disk per message ----------------------------------------------------------------


async def _bytes_per_message(ctx: Context, directory: Path) -> dict[str, list[float]]:
    count = 10_000
    events = _chat_events(count)
    records = [len(encode(event)) for event in events]
    out: dict[str, list[float]] = {"gross": [], "net": [], "vacuumed": [], "record": []}
    rounds = min(ctx.rounds, 3)  # deterministic: a few rounds only confirm it
    for round_index in range(rounds):
        empty = directory / f"empty-{round_index}.sqlite3"
        async with SQLiteStore(empty) as store:
            await store.sessions()  # creates the schema
        _checkpoint(empty)
        path = directory / f"bytes-{round_index}.sqlite3"
        async with SQLiteStore(path) as store:
            # Committed as the actor's group commit would: batches of 50.
            for index in range(0, count, 50):
                await store.commit("bytes", expected_count=index, events=events[index : index + 50])
            _checkpoint(path)
            size = _file_bytes(path)
            base = _file_bytes(empty)
            expect(len(await store.load("bytes")) == count, "bytes: events went missing")
            await store.vacuum()
            vacuumed = _file_bytes(path)
        out["gross"].append(size / count)
        out["net"].append((size - base) / count)
        out["vacuumed"].append((vacuumed - base) / count)
        out["record"].append(statistics.mean(records))
    return out


def bytes_per_message(ctx: Context) -> list[Measurement]:
    """The SQLite file's size per message for 10,000 ~200-byte chat messages (issue 6)."""
    with _directory() as directory:
        rows = anyio.run(_bytes_per_message, ctx, directory, backend="asyncio")
    return [
        measure(
            "stores.bytes_per_message.net",
            "B/message",
            rows["net"],
            note="10,000 chat messages (~200 B of text each; every 10th assistant turn calls "
            "a tool) committed in batches of 50, WAL checkpointed; (file - empty store) / "
            "10,000; a baseline for issue 6",
        ),
        measure("stores.bytes_per_message.gross", "B/message", rows["gross"]),
        measure(
            "stores.bytes_per_message.after_vacuum",
            "B/message",
            rows["vacuumed"],
            note="the same file after `await store.vacuum()` (pages packed)",
        ),
        measure(
            "stores.bytes_per_message.record",
            "B/message",
            rows["record"],
            note="the mean encoded record (nous_session.codec.encode)",
        ),
    ]


BENCHMARKS: list[Any] = [producers, open_session, snapshot, bytes_per_message]
