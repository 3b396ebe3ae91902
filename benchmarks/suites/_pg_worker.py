"""A child process of the "postgres" suite: one long-lived worker, driven by stdin lines.

``python _pg_worker.py URL SCHEMA`` keeps one PostgresStore open and serves one round per
command; it answers on stdout with ``ready`` (its actor is open) and ``result {json}`` (the
round's figures). Commands:

``produce SESSION NAME PRODUCERS SECONDS MODE``
    open the session with ``on_conflict=MODE`` (``raise`` or ``rebase``), print ``ready``,
    wait for ``go START`` (a ``time.time()`` value shared by every worker: the start
    barrier), then run PRODUCERS tasks that append until START + SECONDS, each append
    retried on ConflictError; the result lists every ack ``[seq, producer, n]`` and every
    append's latency in seconds, first try to ack.
``pace SESSION RATE SECONDS PRODUCERS``
    open the session, print ``ready``, wait for ``go START``, then append RATE events a
    second for SECONDS from PRODUCERS tasks on a fixed schedule (each event's data carries
    ``i`` and its issue time ``t``); the result maps seq -> ``i`` and seq -> the time its
    store commit returned.
``follow SESSION EXPECTED TIMEOUT``
    open the session, subscribe from seq 0, print ``ready``, and record the receipt time of
    each event until EXPECTED events (or TIMEOUT seconds).
``many NAME SESSIONS WRITES POOL``
    open a PostgresStore of its own with a pool of at most POOL connections and SESSIONS
    sessions on it (``NAME-0`` ...), each in its own task, print ``ready``, wait for
    ``go START``, then have every session await WRITES appends, one after another, all
    sessions at once; the result holds the appends, the finish time, the process's CPU
    seconds over the run (every thread: the event loop and the pool's), and the store's group
    commit counters.
``many_floor NAME SESSIONS WRITES``
    the floor of ``many``, with no library: SESSIONS tasks (``NAME-0`` ...), each awaiting
    WRITES appends of a made and encoded event, one after another, through one thread with a
    plain psycopg connection that commits every row queued in one transaction (the count
    check and the rows, pipelined: :func:`benchmarks.floors.postgres_group`); the result
    as for ``many``.
``quit``

Times are ``time.time()``: the system-wide clock, comparable across processes on one machine.
Log lines go to stderr, never to the protocol on stdout.
"""

from __future__ import annotations

import json
import logging
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import anyio
import anyio.to_thread
import structlog

# As a deployment would: info and above, rendered to stderr (the actor logs each commit at
# debug level; catch-ups and conflicts at info and warning).
structlog.configure(
    wrapper_class=structlog.make_filtering_bound_logger(logging.INFO),
    logger_factory=structlog.PrintLoggerFactory(file=sys.stderr),
)

# Run as a script: the repository's root is not on the path by itself.
sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from benchmarks.floors import postgres_floor_tables, postgres_group  # noqa: E402
from nous_session import ConflictError, Event, EventType, SessionActor  # noqa: E402
from nous_session.codec import encode  # noqa: E402
from nous_session.event import make_event  # noqa: E402
from nous_session.stores.postgres import PostgresStore  # noqa: E402
from nous_session.stores.postgres._store import group_counts  # noqa: E402

USER = EventType.USER_MESSAGE
FILLER = (
    "the agent reads the ticket, checks the order history, drafts a reply and asks the "
    "customer to confirm the shipping address before it issues the refund for the parcel "
) * 2


def text(index: int) -> str:
    """About 200 bytes of chat text."""
    return f"message {index}: {FILLER[index % 80 :]}"[:200]


class StampingStore(PostgresStore):
    """A PostgresStore noting when each event's commit returned (``time.time()``)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.committed_at: dict[int, float] = {}

    async def commit(
        self, session_id: str, *, events: Sequence[Event], **options: Any
    ) -> str | None:
        uid = await super().commit(session_id, events=events, **options)
        now = time.time()
        for event in events:
            self.committed_at[event.seq] = now
        return uid


def say(line: str) -> None:
    sys.stdout.write(line + "\n")
    sys.stdout.flush()


async def readline() -> str:
    line = await anyio.to_thread.run_sync(sys.stdin.readline)
    return line.strip()


async def wait_for_go() -> float:
    """The start time from the parent's ``go START`` line; sleep until then."""
    command, start = (await readline()).split()
    if command != "go":
        raise SystemExit(f"expected go, got {command!r}")
    start_at = float(start)
    await anyio.sleep(max(0.0, start_at - time.time()))
    return start_at


async def produce(
    store: StampingStore, session_id: str, name: str, producers: int, seconds: float, mode: str
) -> None:
    acks: list[list[int]] = []
    latencies: list[float] = []
    conflicts = [0]
    if mode not in ("raise", "rebase"):
        raise SystemExit(f"unknown on_conflict mode {mode!r}")
    async with SessionActor.open(
        session_id=session_id,
        store=store,
        on_conflict="rebase" if mode == "rebase" else "raise",
    ) as session:
        say("ready")
        start = await wait_for_go()
        end = start + seconds

        async def producer(k: int) -> None:
            n = 0
            while time.time() < end:
                data = {"w": name, "p": k, "n": n, "content": text(n)}
                began = time.perf_counter()
                while True:
                    try:
                        event = await session.append(USER, data)
                        break
                    except ConflictError:
                        conflicts[0] += 1  # the actor has caught up with the winner: again
                latencies.append(time.perf_counter() - began)
                acks.append([event.seq, k, n])
                n += 1

        async with anyio.create_task_group() as task_group:
            for k in range(producers):
                task_group.start_soon(producer, k)
        finished = time.time()
        stats = session.statistics()
    say(
        "result "
        + json.dumps(
            {
                "acks": acks,
                "latencies": latencies,
                "conflicts": conflicts[0],
                "start": start,
                "finished": finished,
                "batches": stats.batches,
                "requests": stats.requests,
            }
        )
    )


async def pace(
    store: StampingStore, session_id: str, rate: float, seconds: float, producers: int
) -> None:
    total = int(rate * seconds)
    each = total // producers
    acks: dict[int, int] = {}
    store.committed_at.clear()
    async with SessionActor.open(session_id=session_id, store=store) as session:
        say("ready")
        start = await wait_for_go()
        # The schedule on the event loop's clock, anchored at the shared start time.
        anchor = anyio.current_time() + (start - time.time())
        interval = producers / rate

        async def producer(k: int) -> None:
            offset = k * interval / producers
            for j in range(each):
                await anyio.sleep_until(anchor + offset + j * interval)
                index = j * producers + k
                data = {"i": index, "t": time.time(), "content": text(index)}
                event = await session.append(USER, data)
                acks[event.seq] = index

        async with anyio.create_task_group() as task_group:
            for k in range(producers):
                task_group.start_soon(producer, k)
        finished = time.time()
    committed = {seq: store.committed_at[seq] for seq in acks}
    say(
        "result "
        + json.dumps({"acks": acks, "committed": committed, "start": start, "finished": finished})
    )


async def follow(store: StampingStore, session_id: str, expected: int, patience: float) -> None:
    seqs: list[int] = []
    received: list[float] = []
    indices: list[int] = []
    stamps: list[float] = []
    timed_out = False
    async with (
        SessionActor.open(session_id=session_id, store=store) as session,
        session.subscribe(0) as events,
    ):
        await anyio.sleep(0.3)  # let the listener connect before the writer starts
        say("ready")
        with anyio.move_on_after(patience) as scope:
            async for event in events:
                received.append(time.time())
                seqs.append(event.seq)
                indices.append(event.data["i"])  # type: ignore[arg-type]
                stamps.append(event.data["t"])  # type: ignore[arg-type]
                if len(seqs) == expected:
                    break
        timed_out = scope.cancelled_caught
    say(
        "result "
        + json.dumps(
            {
                "seqs": seqs,
                "received": received,
                "indices": indices,
                "stamps": stamps,
                "timed_out": timed_out,
            }
        )
    )


async def many(url: str, schema: str, name: str, sessions: int, writes: int, pool: int) -> None:
    opened = [0]
    all_open = anyio.Event()
    go = anyio.Event()
    appended = [0]
    last = [0.0]
    async with PostgresStore(url, schema=schema, max_size=pool) as store:

        async def session(index: int) -> None:
            async with SessionActor.open(session_id=f"{name}-{index}", store=store) as actor:
                opened[0] += 1
                if opened[0] == sessions:
                    all_open.set()
                await go.wait()
                for n in range(writes):
                    await actor.append(USER, {"content": text(n)})
                    appended[0] += 1
                last[0] = max(last[0], time.time())

        async with anyio.create_task_group() as task_group:
            for index in range(sessions):
                task_group.start_soon(session, index)
            await all_open.wait()
            say("ready")
            start = await wait_for_go()
            cpu = time.process_time()
            go.set()
        cpu = time.process_time() - cpu
        finished = last[0]
        transactions, sent = group_counts(store)
    say(
        "result "
        + json.dumps(
            {
                "appends": appended[0],
                "start": start,
                "finished": finished,
                "cpu": cpu,
                "group_transactions": transactions,
                "group_commits": sent,
            }
        )
    )


async def many_floor(url: str, schema: str, name: str, sessions: int, writes: int) -> None:
    names = [f"{name}-{index}" for index in range(sessions)]
    await anyio.to_thread.run_sync(postgres_floor_tables, url, schema, names)
    group = postgres_group(url, schema)
    go = anyio.Event()
    appended = [0]
    last = [0.0]
    try:

        async def session(session_id: str) -> None:
            await go.wait()
            for seq in range(writes):
                record = encode(make_event(seq, USER, {"content": text(seq)}))
                await group.insert((session_id, seq, record))
                appended[0] += 1
            last[0] = max(last[0], time.time())

        async with anyio.create_task_group() as task_group:
            for session_id in names:
                task_group.start_soon(session, session_id)
            say("ready")
            start = await wait_for_go()
            cpu = time.process_time()
            go.set()
        cpu = time.process_time() - cpu
    finally:
        await anyio.to_thread.run_sync(group.close)
    say(
        "result "
        + json.dumps(
            {
                "appends": appended[0],
                "start": start,
                "finished": last[0],
                "cpu": cpu,
                "group_transactions": 0,
                "group_commits": 0,
            }
        )
    )


async def main(url: str, schema: str) -> None:
    async with StampingStore(url, schema=schema) as store:
        while True:
            line = await readline()
            if not line or line == "quit":
                return
            command, *args = line.split()
            if command == "produce":
                session_id, name, producers, seconds, mode = args
                await produce(store, session_id, name, int(producers), float(seconds), mode)
            elif command == "pace":
                session_id, rate, seconds, producers = args
                await pace(store, session_id, float(rate), float(seconds), int(producers))
            elif command == "many":
                name, sessions, writes, pool = args
                await many(url, schema, name, int(sessions), int(writes), int(pool))
            elif command == "many_floor":
                name, sessions, writes = args
                await many_floor(url, schema, name, int(sessions), int(writes))
            elif command == "follow":
                session_id, expected, timeout = args
                await follow(store, session_id, int(expected), float(timeout))
            else:
                raise SystemExit(f"unknown command {command!r}")


if __name__ == "__main__":
    anyio.run(main, sys.argv[1], sys.argv[2], backend="asyncio")
