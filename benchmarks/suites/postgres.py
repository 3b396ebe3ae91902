"""Suite "postgres": PostgresStore across OS processes, against issue 5's performance targets.

Runs only when ``NOUS_SESSION_TEST_POSTGRES`` names a server (``. .ci/postgres`` starts one on
loopback and sets it); otherwise every benchmark says so and reports nothing. Each benchmark
works in a fresh schema, dropped afterwards. The work happens in child processes
(``_pg_worker.py``, one long-lived process per role, driven round by round over stdin), started
together by a start barrier: the parent sends every worker the same ``time.time()`` to start at.

* ``producers``: 4 processes x 50 producers appending to ONE session for a fixed time:
  acknowledged appends/s in total and the append latency (first try to ack), checked
  afterwards: every ack stored once, seqs contiguous, each producer's order kept. Each round
  runs it twice, in alternating order: with ``on_conflict="rebase"`` (the writers' batches go
  through the store's rebasing commit: the database queues them, nothing conflicts;
  ``postgres.producers.*``) and with the default ``on_conflict="raise"`` (optimistic: a
  batch that loses the race fails with ConflictError and its producers retry;
  ``postgres.producers_optimistic.*``).
* ``many_sessions``: 4 processes x 50 sessions (200 in all), every session awaiting its own
  appends one after another, all at once: acknowledged appends/s in total, and each process's
  CPU (every thread: the event loop and the pool's) per append; once per pool size
  (:data:`POOLS`, the most connections each process's PostgresStore may hold), alternating,
  beside its floor (the same sessions' appends through one plain psycopg thread per process
  that group-commits whatever is queued: ``many_floor`` in the worker).
* ``live_tail``: a writer process appending at 1,000/s on a schedule; a subscriber process
  following the session through ``SessionActor.open(store=PostgresStore)`` + ``subscribe()``:
  latency from the writer's commit to the subscriber's receipt; every event seen once, in order.
"""

from __future__ import annotations

import json
import os
import queue
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections import defaultdict
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import IO, Any

from benchmarks.harness import (
    ROOT,
    BenchmarkError,
    Context,
    Measurement,
    Target,
    expect,
    measure,
    percentile,
    ratio,
)

ISSUE_5 = "issue 5"
URL_ENV = "NOUS_SESSION_TEST_POSTGRES"
WORKER = Path(__file__).with_name("_pg_worker.py")
MS = 1e3
PROCESSES, PRODUCERS = 4, 50
TAIL_RATE, TAIL_PRODUCERS = 1_000, 10
MANY_SESSIONS, MANY_WRITES = 50, 100  # per process: 4 x 50 = 200 sessions
POOLS = (1, 2, 8)  # max_size of each process's pool; 8 is PostgresStore's default


def _url() -> str | None:
    """The server's URL, or None after saying why the suite is skipped."""
    url = os.environ.get(URL_ENV)
    if not url:
        print(
            f"   skipped: no PostgreSQL server. Set {URL_ENV}=postgresql://... "
            "(`. .ci/postgres` starts one on 127.0.0.1:54329 and sets it)",
            flush=True,
        )
        return None
    try:
        import psycopg  # noqa: F401
    except ImportError:
        print("   skipped: psycopg is not installed (pip install 'nous_session[postgres]')")
        return None
    return url


@contextmanager
def _schema(url: str, prefix: str) -> Iterator[str]:
    """A fresh schema name for one benchmark; the schema is dropped afterwards."""
    import psycopg

    name = f"bench_{prefix}_{uuid.uuid4().hex[:10]}"
    try:
        yield name
    finally:
        with psycopg.connect(url, autocommit=True) as connection:
            connection.execute(f"DROP SCHEMA IF EXISTS {name} CASCADE")


def _stored(url: str, schema: str, session_id: str) -> list[tuple[int, dict[str, Any]]]:
    """Every stored event of a session, ``(seq, data)``, read and decoded directly."""
    import psycopg

    from nous_session.codec import decode

    with psycopg.connect(url) as connection:
        rows = connection.execute(
            f"SELECT seq, record FROM {schema}.nous_events WHERE session = %s ORDER BY seq",
            (session_id,),
        ).fetchall()
    events = [decode(record) for _, record in rows]
    expect(
        all(event.seq == seq for (seq, _), event in zip(rows, events, strict=True)),
        "a stored row holds the wrong seq",
    )
    return [(event.seq, dict(event.data)) for event in events]


class _Worker:
    """A ``_pg_worker.py`` child: send it lines, read its answers with a deadline."""

    def __init__(self, url: str, schema: str, stderr: IO[str]) -> None:
        self._stderr = stderr
        self.process = subprocess.Popen(
            [sys.executable, str(WORKER), url, schema],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=stderr,
            text=True,
            cwd=ROOT,
        )
        self._lines: queue.Queue[str | None] = queue.Queue()
        stdout = self.process.stdout
        assert stdout is not None

        def read() -> None:
            for line in stdout:
                self._lines.put(line.rstrip("\n"))
            self._lines.put(None)

        threading.Thread(target=read, daemon=True).start()

    def send(self, line: str) -> None:
        assert self.process.stdin is not None
        self.process.stdin.write(line + "\n")
        self.process.stdin.flush()

    def expect(self, word: str, timeout: float) -> str:
        """The rest of the next line, which must start with ``word``."""
        try:
            line = self._lines.get(timeout=timeout)
        except queue.Empty:
            raise BenchmarkError(f"a worker did not answer {word!r} within {timeout:g} s") from None
        if line is None:
            raise BenchmarkError(
                f"a worker exited (status {self.process.wait()}) instead of answering {word!r}: "
                f"{self._tail()}"
            )
        head, _, rest = line.partition(" ")
        expect(head == word, f"a worker said {line[:200]!r}, not {word!r}")
        return rest

    def _tail(self) -> str:
        self._stderr.flush()
        self._stderr.seek(0)
        return " | ".join(self._stderr.read().strip().splitlines()[-5:])

    def close(self) -> None:
        try:
            self.send("quit")
            assert self.process.stdin is not None
            self.process.stdin.close()
            self.process.wait(timeout=20)
        except (OSError, subprocess.TimeoutExpired):
            self.process.kill()
            self.process.wait()


@contextmanager
def _workers(url: str, schema: str, count: int) -> Iterator[list[_Worker]]:
    with ExitStack() as stack:
        workers = []
        for _ in range(count):
            stderr = stack.enter_context(tempfile.TemporaryFile("w+"))
            worker = _Worker(url, schema, stderr)
            stack.callback(worker.close)
            workers.append(worker)
        yield workers


def _go(workers: list[_Worker], lead: float = 0.2) -> float:
    """The start barrier: every worker gets the same start time, a moment from now."""
    start = time.time() + lead
    for worker in workers:
        worker.send(f"go {start!r}")
    return start


# Four processes, one session ------------------------------------------------------------------


def _check_producers(
    stored: list[tuple[int, dict[str, Any]]], results: list[dict[str, Any]]
) -> None:
    acked = sorted(
        (seq, f"w{w}", producer, n)
        for w, result in enumerate(results)
        for seq, producer, n in result["acks"]
    )
    expect(acked, "producers: nothing was acknowledged")
    expect(
        [seq for seq, _ in stored] == list(range(len(stored))),
        "producers: the stored seqs are not contiguous from 0",
    )
    rows = [(seq, data["w"], data["p"], data["n"]) for seq, data in stored]
    expect(len(acked) == len({a[0] for a in acked}), "producers: two acks share a seq")
    expect(rows == acked, "producers: the stored events are not exactly the acknowledged ones")
    order: dict[tuple[str, int], list[int]] = defaultdict(list)
    for _, worker, producer, n in rows:
        order[(worker, producer)].append(n)
    expect(
        all(ns == list(range(len(ns))) for ns in order.values()),
        "producers: a producer's order was not kept",
    )


def _produce_round(
    url: str, schema: str, workers: list[Any], session_id: str, mode: str, seconds: float
) -> dict[str, float]:
    """One round of 4 x 50 producers on a fresh session; its figures, checked."""
    for w, worker in enumerate(workers):
        worker.send(f"produce {session_id} w{w} {PRODUCERS} {seconds} {mode}")
    for worker in workers:
        worker.expect("ready", 60)
    start = _go(workers)
    results = [json.loads(w.expect("result", seconds + 120)) for w in workers]
    _check_producers(_stored(url, schema, session_id), results)
    total = sum(len(result["acks"]) for result in results)
    elapsed = max(result["finished"] for result in results) - start
    latencies = sorted(lat for result in results for lat in result["latencies"])
    expect(len(latencies) == total, "producers: a latency per ack")
    return {
        "rate": total / elapsed,
        "p50": percentile(latencies, 0.50) * MS,
        "p99": percentile(latencies, 0.99) * MS,
        "max": latencies[-1] * MS,
        "conflicts": sum(r["conflicts"] for r in results) / total,
        "batch": sum(r["requests"] for r in results) / max(1, sum(r["batches"] for r in results)),
        "share": min(len(r["acks"]) for r in results) / (total / PROCESSES),
    }


def producers(ctx: Context) -> list[Measurement]:
    """4 OS processes x 50 producers appending to one session on local PostgreSQL."""
    url = _url()
    if url is None:
        return []
    seconds = 1.5 if ctx.quick else 5.0
    out: dict[str, dict[str, list[float]]] = {
        "rebase": defaultdict(list),
        "raise": defaultdict(list),
    }
    with _schema(url, "producers") as schema, _workers(url, schema, PROCESSES) as workers:
        for round_index in range(ctx.rounds):
            # Side by side: both modes in every round, the first one alternating.
            modes = ("rebase", "raise") if round_index % 2 == 0 else ("raise", "rebase")
            for mode in modes:
                figures = _produce_round(
                    url, schema, workers, f"producers-{mode}-{round_index}", mode, seconds
                )
                for key, value in figures.items():
                    out[mode][key].append(value)
    what = (
        f"{PROCESSES} OS processes x {PRODUCERS} producers, each awaiting appends (200 B chat "
        f"events) to ONE session for {seconds:g} s after a common start; acks / (last ack - "
        "start); afterwards every ack is checked stored once, seqs contiguous, each producer's "
        "order kept"
    )
    rebase, raise_ = out["rebase"], out["raise"]
    return [
        measure(
            "postgres.producers.rate",
            "appends/s",
            rebase["rate"],
            target=Target(">=", 10_000, ISSUE_5),
            note=f'{what}; SessionActor.open(on_conflict="rebase"): batches of plain appends '
            "go through PostgresStore.commit_rebased, queued on the session's row lock",
        ),
        measure(
            "postgres.producers.latency_p99",
            "ms",
            rebase["p99"],
            note="append latency from its first try to its ack, over every append of every process",
        ),
        measure("postgres.producers.latency_p50", "ms", rebase["p50"]),
        measure("postgres.producers.latency_max", "ms", rebase["max"]),
        measure(
            "postgres.producers.conflicts_per_ack",
            "retries/ack",
            rebase["conflicts"],
            note="ConflictErrors the producers caught, per acknowledged append",
        ),
        measure(
            "postgres.producers.mean_batch",
            "requests/commit",
            rebase["batch"],
            note="summed statistics() of the 4 actors: requests / successful commits",
        ),
        measure(
            "postgres.producers.fairness",
            "x",
            rebase["share"],
            note="the least served process's acks / an equal share (1 = even)",
        ),
        measure(
            "postgres.producers_optimistic.rate",
            "appends/s",
            raise_["rate"],
            note=f'{what}; the default on_conflict="raise": a losing batch fails with '
            "ConflictError and its producers retry (same rounds as postgres.producers, "
            "interleaved)",
        ),
        measure("postgres.producers_optimistic.latency_p99", "ms", raise_["p99"]),
        measure("postgres.producers_optimistic.latency_p50", "ms", raise_["p50"]),
        measure(
            "postgres.producers_optimistic.conflicts_per_ack",
            "retries/ack",
            raise_["conflicts"],
        ),
        measure("postgres.producers_optimistic.fairness", "x", raise_["share"]),
    ]


# 200 sessions over four processes ------------------------------------------------------------


def _all_at_once(
    workers: list[_Worker], commands: list[str], expected: int, what: str
) -> tuple[float, list[dict[str, Any]], float]:
    """Send each worker its command, start them together, and collect their results: the
    results, the appends acknowledged in all, and the rate (appends over the time from the
    common start to the last acknowledgement)."""
    for worker, command in zip(workers, commands, strict=True):
        worker.send(command)
    for worker in workers:
        worker.expect("ready", 120)
    start = _go(workers)
    results = [json.loads(w.expect("result", 300)) for w in workers]
    total = sum(result["appends"] for result in results)
    expect(total == expected, f"{what}: {total} appends acknowledged, not {expected}")
    return total, results, total / (max(result["finished"] for result in results) - start)


def _many_round(
    url: str, schema: str, workers: list[_Worker], round_index: int, pool: int, writes: int
) -> dict[str, float]:
    names = [f"many-{round_index}-p{pool}-w{w}" for w in range(len(workers))]
    total, results, rate = _all_at_once(
        workers,
        [f"many {name} {MANY_SESSIONS} {writes} {pool}" for name in names],
        len(workers) * MANY_SESSIONS * writes,
        "many_sessions",
    )
    for name in names:
        for index in (0, MANY_SESSIONS - 1):
            stored = _stored(url, schema, f"{name}-{index}")
            expect(
                [seq for seq, _ in stored] == list(range(writes)),
                f"many_sessions: session {name}-{index} does not hold its {writes} events",
            )
    transactions = sum(result["group_transactions"] for result in results)
    return {
        "rate": rate,
        "cpu_us": sum(result["cpu"] for result in results) / total * 1e6,
        "grouped": sum(result["group_commits"] for result in results) / total,
        "group": sum(result["group_commits"] for result in results) / max(1, transactions),
    }


def _many_floor_round(
    url: str, schema: str, workers: list[_Worker], round_index: int, writes: int
) -> dict[str, float]:
    total, results, rate = _all_at_once(
        workers,
        [
            f"many_floor floor-{round_index}-w{w} {MANY_SESSIONS} {writes}"
            for w in range(len(workers))
        ],
        len(workers) * MANY_SESSIONS * writes,
        "many_sessions floor",
    )
    import psycopg

    with psycopg.connect(url) as connection:
        rows, moved = connection.execute(
            f"SELECT (SELECT count(*) FROM {schema}.floor_events WHERE session LIKE %s),"
            f" (SELECT sum(count) FROM {schema}.floor_sessions WHERE name LIKE %s)",
            (f"floor-{round_index}-%", f"floor-{round_index}-%"),
        ).fetchone()
    expect(rows == moved == total, "many_sessions floor: rows and counts disagree")
    return {
        "rate": rate,
        "cpu_us": sum(result["cpu"] for result in results) / total * 1e6,
    }


def many_sessions(ctx: Context) -> list[Measurement]:
    """200 sessions over 4 OS processes, each session awaiting its own appends."""
    url = _url()
    if url is None:
        return []
    writes = 20 if ctx.quick else MANY_WRITES
    out: dict[int, dict[str, list[float]]] = {pool: defaultdict(list) for pool in POOLS}
    floor: dict[str, list[float]] = defaultdict(list)
    with _schema(url, "many") as schema, _workers(url, schema, PROCESSES) as workers:
        for round_index in range(ctx.rounds):
            pools = POOLS if round_index % 2 == 0 else POOLS[::-1]
            if round_index % 2:
                for key, value in _many_floor_round(
                    url, schema, workers, round_index, writes
                ).items():
                    floor[key].append(value)
            for pool in pools:
                figures = _many_round(url, schema, workers, round_index, pool, writes)
                for key, value in figures.items():
                    out[pool][key].append(value)
            if round_index % 2 == 0:
                for key, value in _many_floor_round(
                    url, schema, workers, round_index, writes
                ).items():
                    floor[key].append(value)
    what = (
        f"{PROCESSES} OS processes x {MANY_SESSIONS} sessions, each session awaiting {writes} "
        "appends (200 B chat events) one after another through SessionActor.append, all "
        "sessions at once after a common start; acks / (last ack - start)"
    )
    measurements = [
        measure(
            "postgres.many_sessions.floor.rate",
            "appends/s",
            floor["rate"],
            note="the floor, same processes and sessions, no library: each session's task "
            "makes and encodes its event and awaits one thread per process with a plain "
            "psycopg connection, which commits every row queued in one transaction (the "
            "sessions' count check and the rows, pipelined; benchmarks/floors.py)",
        ),
        measure(
            "postgres.many_sessions.floor.client_cpu",
            "us/append",
            floor["cpu_us"],
            note="the floor's 4 processes' CPU time over the run / appends",
        ),
        ratio(
            "postgres.many_sessions.pool_8.vs_floor",
            out[8]["rate"],
            floor["rate"],
            note="ours at the default pool / the floor, the rounds side by side",
        ),
    ]
    for pool in POOLS:
        figures = out[pool]
        measurements += [
            measure(
                f"postgres.many_sessions.pool_{pool}.rate",
                "appends/s",
                figures["rate"],
                target=Target(">=", 10_000, "issue 20") if pool == 8 else None,
                note=f"{what}; each process's PostgresStore(max_size={pool})",
            ),
            measure(
                f"postgres.many_sessions.pool_{pool}.client_cpu",
                "us/append",
                figures["cpu_us"],
                note="the 4 processes' CPU time (time.process_time: event loop and pool threads)"
                " over the run / acknowledged appends",
            ),
            measure(
                f"postgres.many_sessions.pool_{pool}.mean_group",
                "commits/transaction",
                figures["group"],
                note="commits per grouped transaction (the store's group commit across sessions)",
            ),
        ]
    return measurements


# Live tail across processes -----------------------------------------------------------------


def live_tail(ctx: Context) -> list[Measurement]:
    """Commit in one process -> delivery in another, at 1,000 offered appends/s."""
    url = _url()
    if url is None:
        return []
    seconds = 1.5 if ctx.quick else 5.0
    total = int(TAIL_RATE * seconds) // TAIL_PRODUCERS * TAIL_PRODUCERS
    out: dict[str, list[float]] = defaultdict(list)
    with _schema(url, "tail") as schema, _workers(url, schema, 2) as (writer, follower):
        for round_index in range(ctx.rounds):
            session_id = f"tail-{round_index}"
            follower.send(f"follow {session_id} {total} {seconds + 60}")
            follower.expect("ready", 60)
            writer.send(f"pace {session_id} {TAIL_RATE} {seconds} {TAIL_PRODUCERS}")
            writer.expect("ready", 60)
            start = _go([writer])
            wrote = json.loads(writer.expect("result", seconds + 120))
            seen = json.loads(follower.expect("result", seconds + 120))

            acks = {int(seq): index for seq, index in wrote["acks"].items()}
            committed = {int(seq): at for seq, at in wrote["committed"].items()}
            expect(
                sorted(acks) == list(range(total)), "live tail: the writer's acks are not 0..n-1"
            )
            expect(not seen["timed_out"], f"live tail: the subscriber saw {len(seen['seqs'])}")
            expect(
                seen["seqs"] == list(range(total)),
                "live tail: the subscriber did not see every event once, in seq order",
            )
            expect(
                all(acks[seq] == i for seq, i in zip(seen["seqs"], seen["indices"], strict=True)),
                "live tail: the subscriber saw other events than the writer acknowledged",
            )
            latencies = sorted(
                received - committed[seq]
                for seq, received in zip(seen["seqs"], seen["received"], strict=True)
            )
            expect(latencies[0] > -0.05, f"live tail: clocks disagree ({latencies[0]:.3f} s)")
            end_to_end = sorted(
                received - stamp
                for received, stamp in zip(seen["received"], seen["stamps"], strict=True)
            )
            out["p50"].append(percentile(latencies, 0.50) * MS)
            out["p99"].append(percentile(latencies, 0.99) * MS)
            out["max"].append(latencies[-1] * MS)
            out["e2e_p50"].append(percentile(end_to_end, 0.50) * MS)
            out["e2e_p99"].append(percentile(end_to_end, 0.99) * MS)
            out["rate"].append(total / (wrote["finished"] - start))
    return [
        measure(
            "postgres.live_tail.latency_p99",
            "ms",
            out["p99"],
            target=Target("<=", 50, ISSUE_5),
            note=f"a writer process appends {TAIL_RATE:,}/s for {seconds:g} s ({TAIL_PRODUCERS} "
            "tasks on a fixed schedule); a subscriber process follows the session through "
            "SessionActor.open(store=PostgresStore) + subscribe(0) (LISTEN/NOTIFY, then a "
            "read); latency = receipt (time.time() in the subscriber) - the writer's store "
            "commit returning (time.time() in the writer); every event seen once, in order",
        ),
        measure("postgres.live_tail.latency_p50", "ms", out["p50"]),
        measure("postgres.live_tail.latency_max", "ms", out["max"]),
        measure(
            "postgres.live_tail.e2e_p50",
            "ms",
            out["e2e_p50"],
            note="from the writer calling append (its stamp in the event) to receipt",
        ),
        measure("postgres.live_tail.e2e_p99", "ms", out["e2e_p99"]),
        measure(
            "postgres.live_tail.rate",
            "appends/s",
            out["rate"],
            note="the writer's achieved rate: appends / (last ack - start)",
        ),
    ]


BENCHMARKS = [producers, many_sessions, live_tail]
