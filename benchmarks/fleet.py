"""The fleet soak (issue 33): worker processes sharing one store, one of them killed and the
database restarted under them, and afterwards the checks that nothing acknowledged was lost,
doubled or seen in two orders.

``python benchmarks/fleet.py --store sqlite|postgres [--url URL] --workers 4 --sessions 200
--turns 2000 [--kill] [--restart-postgres CMD] [--json]``

:func:`run_fleet` starts ``workers`` processes (:mod:`benchmarks.fleet_worker`), each running
one :class:`~nous_session.Sessions` registry on the store with compaction on and a counting
summarizer, and sends every turn (a user message to one of ``sessions`` sessions, with an
idempotency key of its own) to a random worker, up to ``depth`` turns in flight per worker.
About 40% through (``kill``) it kills one worker with SIGKILL, starts another in its place and
sends the dead worker's unacknowledged turns again, with the same keys, to random workers;
about 60% through (``restart``) it runs a command that restarts the database and carries on
meanwhile. A turn that fails with an unknown outcome or a store error is sent again, after a
short backoff, until it is acknowledged or ``give_up`` seconds have passed since its first
failure (a failure of the run). Then the checks, on the store read directly:

* every acknowledged turn's text is stored exactly once, at the seq it was acknowledged at
  (a turn acknowledged twice, once before a kill and once after its retry, must have the
  same seq both times);
* every worker that exited normally holds, for every session it touched, a prefix of what
  the store holds (the same events, encoded byte for byte, in the same order);
* every session opens;
* summarizer calls (counted in a file, so a killed worker's calls count) per committed
  summary at most :data:`MAX_CALLS_PER_SUMMARY`;
* no call goes unanswered: a worker gives a call up after ``stuck_after`` seconds and the
  turn is sent again; a stuck turn that had been sent only once fails the run, one that was
  being sent again (its key possibly stored already) is listed in ``FleetResult.stuck``. The
  library has a bug that leaves such calls unanswered (a known key queued beside a new append
  whose commit loses to another writer: ``tests/faults/test_fleet_soak.py``); the test allows
  those until it is fixed.

It reports throughput (acknowledged turns per second, first send to last ack) and the p50 and
p99 append latency (inside the worker: from reading the turn to its commit).
"""

from __future__ import annotations

import argparse
import collections
import heapq
import json
import os
import queue
import random
import signal
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Iterator, Sequence
from contextlib import contextmanager, suppress
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import IO, Any

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:  # run as a script, sys.path[0] is benchmarks/
    sys.path.insert(0, str(ROOT))

from benchmarks.fleet_worker import SUMMARY_MARK, digest  # noqa: E402

WORKER = Path(__file__).with_name("fleet_worker.py")
RESULTS = ROOT / "benchmarks" / "results" / "fleet.json"
MAX_CALLS_PER_SUMMARY = 1.1
KILL_AT, RESTART_AT = 0.4, 0.6  # shares of the turns acknowledged


class FleetError(AssertionError):
    """A check of the soak failed, or the run could not finish; the message says which."""


@dataclass
class FleetResult:
    """What a run did and measured; :meth:`problems` is empty when every check passed."""

    store: str
    workers: int
    sessions: int
    turns: int
    acked: int = 0
    seconds: float = 0.0
    throughput: float = 0.0  # acknowledged turns per second
    p50_ms: float = 0.0
    p99_ms: float = 0.0
    retries: int = 0  # turns sent again after an error or a kill
    errors: dict[str, int] = field(default_factory=dict)  # error kinds the workers reported
    killed: int = 0
    restart_seconds: float | None = None
    summarizer_calls: int = 0
    summaries: int = 0
    calls_per_summary: float = 0.0
    followers_checked: int = 0
    # Turns whose call had no answer after ``stuck_after`` (sent again, same key): each with
    # whether it had been sent before (its key may have been stored already).
    stuck: list[dict[str, Any]] = field(default_factory=list)
    failures: list[str] = field(default_factory=list)

    def problems(self) -> list[str]:
        return self.failures

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class _Turn:
    id: str
    session: str
    text: str


class _Child:
    """One worker process: its stdin, and a thread that puts its stdout's lines on the
    coordinator's queue tagged with this child, so a dead child's late lines are known."""

    def __init__(
        self,
        slot: int,
        generation: int,
        arguments: list[str],
        lines: queue.Queue[tuple[_Child, dict[str, Any] | None]],
        stderr: IO[str],
    ) -> None:
        self.slot = slot
        self.name = f"w{slot}.{generation}"
        self.process = subprocess.Popen(
            [sys.executable, str(WORKER), arguments[0], self.name, *arguments[1:]],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=stderr,
            text=True,
        )
        self.in_flight: dict[str, _Turn] = {}
        self.done: dict[str, Any] | None = None
        self.alive = True  # False once killed on purpose
        threading.Thread(target=self._pump, args=(lines,), daemon=True).start()

    def _pump(self, lines: queue.Queue[tuple[_Child, dict[str, Any] | None]]) -> None:
        assert self.process.stdout is not None
        with suppress(ValueError, OSError):  # the pipe closed under us after a kill
            for line in self.process.stdout:
                lines.put((self, json.loads(line)))
        lines.put((self, None))  # end of output

    def send(self, turn: _Turn) -> bool:
        """Send a turn; False when the child is gone (its pipe broke)."""
        assert self.process.stdin is not None
        try:
            self.process.stdin.write(json.dumps(turn.__dict__) + "\n")
            self.process.stdin.flush()
        except OSError:  # BrokenPipeError: it died
            return False
        self.in_flight[turn.id] = turn
        return True

    def finish(self) -> None:
        """Close stdin: the worker finishes its turns, reports and exits."""
        assert self.process.stdin is not None
        with suppress(OSError):
            self.process.stdin.close()

    def kill(self) -> None:
        self.alive = False
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGKILL)
        self.process.wait(timeout=30)


@contextmanager
def _ending(children: list[_Child]) -> Iterator[None]:
    """Kill every child still running when the run ends, however it ends."""
    try:
        yield
    finally:
        for child in children:
            if child.process.poll() is None:
                child.process.kill()
                child.process.wait(timeout=30)
            for stream in (child.process.stdin, child.process.stdout):
                if stream is not None:
                    with suppress(OSError):
                        stream.close()


def _percentile(sorted_values: Sequence[float], fraction: float) -> float:
    if not sorted_values:
        return 0.0
    index = min(len(sorted_values) - 1, max(0, round(fraction * (len(sorted_values) - 1))))
    return sorted_values[index]


@dataclass(frozen=True)
class FleetOptions:
    """How a soak runs.

    Attributes:
        workers: how many worker processes.
        sessions: how many sessions the turns are spread over (uniformly at random).
        turns: how many turns to acknowledge.
        kill: SIGKILL one worker about 40% through, and start another in its place.
        restart: a shell command restarting the database, run about 60% through.
        depth: turns in flight per worker at most.
        summary_delay: seconds each summarizer call sleeps.
        turn_ttl: the compaction policy's ``turn_ttl`` (how long a killed worker's turn to
            compact a session holds the others off).
        give_up: seconds after a turn's first error before it counts as failed.
        stuck_after: seconds a worker waits for a call's answer before it gives the call up
            and reports the turn stuck (it is sent again, same key; see ``FleetResult.stuck``).
        deadline: seconds the whole run may take before it fails.
        seed: for the routing and the sessions' choice (None: a fresh one).
        backend: the workers' event loop, ``"asyncio"`` or ``"trio"``.
    """

    workers: int = 4
    sessions: int = 200
    turns: int = 2_000
    kill: bool = False
    restart: str | None = None
    depth: int = 16
    summary_delay: float = 0.02
    turn_ttl: float = 30.0
    give_up: float = 30.0
    stuck_after: float = 15.0
    deadline: float = 600.0
    seed: int | None = None
    backend: str = "asyncio"


def run_fleet(url: str, options: FleetOptions | None = None, **overrides: Any) -> FleetResult:
    """Run the soak on the store at ``url`` (see the module's docstring) and check it.

    Args:
        url: any store URL (a PostgreSQL one may point at PgBouncer). The run's sessions and
            keys have names of their own (a random prefix, whatever the seed), so the store may
            hold other runs' sessions.
        options: how to run; ``overrides`` replace some of its fields
            (``run_fleet(url, workers=1)``).

    Returns:
        the figures; its ``failures`` lists every check that failed (empty: all passed).

    Raises:
        FleetError: the run could not finish (a worker died unexpectedly, the deadline passed).
    """
    options = replace(options or FleetOptions(), **overrides)
    with tempfile.TemporaryDirectory(prefix="fleet-") as scratch:
        coordinator = _Coordinator(url, options, Path(scratch))
        try:
            coordinator.run()
        finally:
            coordinator.stderr.close()
    return coordinator.result


class _Coordinator:
    """One run: the plan of turns, the workers, and the state of every turn."""

    def __init__(self, url: str, options: FleetOptions, scratch: Path) -> None:
        self.url = url
        self.options = options
        self.rng = random.Random(options.seed)
        # Fresh names even with a seed: a rerun on the same store must not find its keys.
        run_id = f"fleet-{uuid.uuid4().hex[:8]}"
        self.names = [f"{run_id}-s{index}" for index in range(options.sessions)]
        self.plan = {
            turn.id: turn
            for turn in (
                _Turn(f"{run_id}-t{index}", self.rng.choice(self.names), f"turn {run_id} {index}")
                for index in range(options.turns)
            )
        }
        self.result = FleetResult(
            store=url.split(":", 1)[0],
            workers=options.workers,
            sessions=options.sessions,
            turns=options.turns,
        )
        self.calls = scratch / "calls"
        self.calls.touch()
        self.stderr = open(scratch / "stderr", "w+")  # noqa: SIM115  # closed by run_fleet
        self.lines: queue.Queue[tuple[_Child, dict[str, Any] | None]] = queue.Queue()
        self.generations = [0] * options.workers
        self.children: list[_Child] = []  # every child started, for _ending
        self.slots: list[_Child] = []  # the live child of each slot
        self.pending: collections.deque[_Turn] = collections.deque(self.plan.values())
        self.later: list[tuple[float, str]] = []  # (not before, turn id): retries backing off
        self.first_error: dict[str, float] = {}
        self.attempts: collections.Counter[str] = collections.Counter()
        self.resent: set[str] = set()  # turns sent more than once (after a kill or an error)
        self.acked: dict[str, int] = {}  # turn id -> seq; -1: failed for good
        self.latencies: list[float] = []
        self.errors: collections.Counter[str] = collections.Counter()
        self.restart_took: list[float] = []
        self.end_by = 0.0

    def run(self) -> None:
        self.end_by = time.perf_counter() + self.options.deadline
        try:
            with _ending(self.children):
                self.slots = [self.spawn(slot) for slot in range(self.options.workers)]
                self.drive()
                follow = self.finish()
        except FleetError as error:
            raise FleetError(f"{error}\n{self.stderr_tail()}") from None
        self.result.summarizer_calls = len(self.calls.read_text().splitlines())
        self.check_store(follow)
        if self.result.failures:
            self.result.failures.append(self.stderr_tail())

    def stderr_tail(self) -> str:
        self.stderr.seek(0)
        return "--- workers' stderr (tail) ---\n" + self.stderr.read()[-4000:]

    def spawn(self, slot: int) -> _Child:
        options = self.options
        child = _Child(
            slot,
            self.generations[slot],
            [
                *(self.url, str(self.calls)),
                *("--summary-delay", str(options.summary_delay)),
                *("--turn-ttl", str(options.turn_ttl)),
                *("--stuck-after", str(options.stuck_after)),
                *("--backend", options.backend),
            ],
            self.lines,
            self.stderr,
        )
        self.generations[slot] += 1
        self.children.append(child)
        return child

    def in_flight(self) -> str:
        """Which worker has which turns (the first few), for a message."""
        return "; ".join(
            f"{child.name} (pid {child.process.pid}): {', '.join(sorted(child.in_flight)[:5])}"
            for child in self.slots
            if child.in_flight
        )

    def requeue(self, turn_id: str, delay: float = 0.0) -> None:
        self.result.retries += 1
        self.resent.add(turn_id)
        if delay:
            heapq.heappush(self.later, (time.perf_counter() + delay, turn_id))
        else:
            self.pending.appendleft(self.plan[turn_id])

    def route(self) -> None:
        """Every pending turn to a random worker with room, while there is room."""
        now = time.perf_counter()
        while self.later and self.later[0][0] <= now:
            self.pending.append(self.plan[heapq.heappop(self.later)[1]])
        while self.pending:
            open_slots = [c for c in self.slots if len(c.in_flight) < self.options.depth]
            if not open_slots:
                return
            turn = self.pending.popleft()
            if turn.id in self.acked:
                continue  # acknowledged by a killed worker's last lines after all
            if not self.rng.choice(open_slots).send(turn):
                self.pending.appendleft(turn)
                return  # that child is dying: its end of output comes next

    def drive(self) -> None:
        """Send every turn until acknowledged (or failed for good), with the faults."""
        options, result = self.options, self.result
        restarter: threading.Thread | None = None
        killed = False
        started = last_ack = time.perf_counter()
        while len(self.acked) < len(self.plan):
            if time.perf_counter() > self.end_by:
                raise FleetError(
                    f"the run took more than {options.deadline} s: {len(self.acked)} of "
                    f"{len(self.plan)} turns done, {len(self.pending)} pending, "
                    f"{len(self.later)} backing off; in flight: {self.in_flight()}"
                )
            self.route()
            wait = min(max(self.later[0][0] - time.perf_counter(), 0.0), 0.5) if self.later else 0.5
            try:
                child, message = self.lines.get(timeout=wait)
            except queue.Empty:
                continue
            if message is None:
                if child.alive:
                    raise FleetError(f"worker {child.name} exited unexpectedly mid-run")
            elif "ack" in message:
                if self.acknowledge(child, message):
                    last_ack = time.perf_counter()
            elif "error" in message:
                self.failed(child, message)
            elif "stuck" in message:
                self.stuck(child, message["stuck"])
            # The faults, once each, when their share of the turns is acknowledged.
            if options.kill and not killed and len(self.acked) >= KILL_AT * len(self.plan):
                killed = True
                self.kill_one()
            if (
                options.restart
                and restarter is None
                and len(self.acked) >= RESTART_AT * len(self.plan)
            ):
                restarter = threading.Thread(target=self.restart_database, args=(options.restart,))
                restarter.start()
        if restarter is not None:
            restarter.join(timeout=max(1.0, self.end_by - time.perf_counter()))
            if self.restart_took:
                result.restart_seconds = self.restart_took[0]
        result.seconds = last_ack - started
        result.acked = sum(1 for seq in self.acked.values() if seq >= 0)
        result.throughput = result.acked / result.seconds if result.seconds else 0.0
        ordered = sorted(self.latencies)
        result.p50_ms = _percentile(ordered, 0.5) * 1e3
        result.p99_ms = _percentile(ordered, 0.99) * 1e3
        result.errors = dict(self.errors)

    def acknowledge(self, child: _Child, message: dict[str, Any]) -> bool:
        """Take an ack; True when it is the turn's first."""
        turn_id, seq = message["ack"], message["seq"]
        child.in_flight.pop(turn_id, None)
        if turn_id in self.acked:
            if self.acked[turn_id] != seq:
                self.result.failures.append(
                    f"{turn_id} acknowledged at seq {self.acked[turn_id]} and again at {seq}"
                )
            return False
        self.acked[turn_id] = seq
        self.latencies.append(message["latency"])
        return True

    def failed(self, child: _Child, message: dict[str, Any]) -> None:
        """Take an error: send the turn again later, or count it failed for good."""
        turn_id = message["error"]
        child.in_flight.pop(turn_id, None)
        self.errors[message["kind"]] += 1
        if turn_id in self.acked:
            return
        first = self.first_error.setdefault(turn_id, time.perf_counter())
        what = f"{message['kind']}: {message['message']}"
        if not message["retry"]:
            self.result.failures.append(f"{turn_id} failed: {what}")
            self.acked[turn_id] = -1  # done, so the run ends; reported as failed
        elif time.perf_counter() - first > self.options.give_up:
            self.result.failures.append(
                f"{turn_id} still failing {self.options.give_up} s after its first error: {what}"
            )
            self.acked[turn_id] = -1
        else:
            self.attempts[turn_id] += 1
            self.requeue(turn_id, delay=min(0.05 * 2 ** self.attempts[turn_id], 1.0))

    def stuck(self, child: _Child, turn_id: str) -> None:
        """A call with no answer: recorded, and the turn sent again (same key)."""
        child.in_flight.pop(turn_id, None)
        if turn_id in self.acked:
            return
        resent = turn_id in self.resent
        self.result.stuck.append({"turn": turn_id, "worker": child.name, "resent": resent})
        if not resent:
            self.result.failures.append(
                f"{turn_id} (sent once) had no answer from {child.name} after "
                f"{self.options.stuck_after} s"
            )
        self.requeue(turn_id)

    def kill_one(self) -> None:
        """SIGKILL a random worker, start another in its slot, and send its unacknowledged
        turns again (same keys) to random workers."""
        victim = self.rng.choice(self.slots)
        victim.kill()
        self.result.killed += 1
        self.slots[victim.slot] = self.spawn(victim.slot)
        for turn_id in victim.in_flight:
            if turn_id not in self.acked:
                self.requeue(turn_id)
        victim.in_flight.clear()

    def restart_database(self, command: str) -> None:
        began = time.perf_counter()
        done = subprocess.run(command, shell=True, capture_output=True, text=True)
        self.restart_took.append(time.perf_counter() - began)
        if done.returncode != 0:
            self.result.failures.append(
                f"the restart command {command!r} failed: {done.stderr.strip()}"
            )

    def finish(self) -> list[dict[str, Any]]:
        """Close every live worker's stdin and collect its report before it exits."""
        for child in self.slots:
            child.finish()
        waiting = set(self.slots)
        while waiting:
            remaining = self.end_by - time.perf_counter()
            if remaining <= 0:
                names = ", ".join(sorted(child.name for child in waiting))
                raise FleetError(f"workers {names} did not finish before the deadline")
            try:
                child, message = self.lines.get(timeout=remaining)
            except queue.Empty:
                continue
            if child not in waiting:
                continue  # a killed worker's last lines
            if message is None:
                if child.done is None:
                    raise FleetError(f"worker {child.name} exited without its report")
                waiting.discard(child)
            elif "done" in message:
                child.done = message
        for child in self.slots:
            code = child.process.wait(timeout=max(1.0, self.end_by - time.perf_counter()))
            if code != 0:
                raise FleetError(f"worker {child.name} exited with {code}")
        return [child.done for child in self.slots if child.done is not None]

    def check_store(self, follow: list[dict[str, Any]]) -> None:
        """The checks on the store itself; failures go to ``result.failures``."""
        import anyio

        result = self.result
        anyio.run(self.check_sessions, follow)
        result.calls_per_summary = (
            result.summarizer_calls / result.summaries if result.summaries else 0.0
        )
        if result.summaries and result.calls_per_summary > MAX_CALLS_PER_SUMMARY:
            result.failures.append(
                f"{result.summarizer_calls} summarizer calls for {result.summaries} summaries: "
                f"{result.calls_per_summary:.2f} per summary, more than {MAX_CALLS_PER_SUMMARY}"
            )
        if not result.summaries and result.summarizer_calls:
            result.failures.append(
                f"{result.summarizer_calls} summarizer calls and no summary committed"
            )

    async def check_sessions(self, follow: list[dict[str, Any]]) -> None:
        """Each session: every acknowledged turn stored once at its seq, the summaries
        counted, the session opens; then each worker's report against the store."""
        from nous_session import SessionActor
        from nous_session.stores import open_store

        result, acked = self.result, self.acked
        by_session: dict[str, list[_Turn]] = collections.defaultdict(list)
        for turn in self.plan.values():
            if acked.get(turn.id, -1) >= 0:
                by_session[turn.session].append(turn)
        failures = result.failures
        stored: dict[str, list[Any]] = {}
        store = open_store(self.url)
        try:
            for name in self.names:
                events = stored[name] = list(await store.load(name))
                texts: collections.Counter[str] = collections.Counter()
                seq_of: dict[str, int] = {}
                for event in events:
                    content = event.data.get("content")
                    if not isinstance(content, str):
                        continue
                    if event.type == "user_message":
                        texts[content] += 1
                        seq_of[content] = event.seq
                    elif event.type == "system_message" and content.startswith(SUMMARY_MARK):
                        result.summaries += 1
                for turn in by_session[name]:
                    if texts[turn.text] != 1:
                        failures.append(
                            f"{turn.id} acknowledged, stored {texts[turn.text]} times in {name}"
                        )
                    elif seq_of[turn.text] != acked[turn.id]:
                        failures.append(
                            f"{turn.id} acknowledged at seq {acked[turn.id]}, "
                            f"stored at {seq_of[turn.text]}"
                        )
                try:
                    async with SessionActor.open(session_id=name, store=store, follow=False):
                        pass
                except Exception as error:  # any failure to open is what this check reports
                    failures.append(f"session {name} does not open: {error!r}")
        finally:
            await store.aclose()
        for report in follow:
            for name, (count, held) in report["follow"].items():
                result.followers_checked += 1
                events = stored.get(name, [])
                if count > len(events) or held != digest(events, count):
                    failures.append(
                        f"worker {report['done']} holds {count} events of {name} that are "
                        f"not the store's first {count} ({len(events)} stored)"
                    )


def table(results: Sequence[FleetResult]) -> str:
    """The report: one row per run."""
    header = (
        f"{'store':<9}{'workers':>8}{'sessions':>9}{'turns':>7}{'turns/s':>9}"
        f"{'p50 ms':>8}{'p99 ms':>8}{'retries':>8}{'calls':>7}{'summaries':>10}"
        f"{'calls/sum':>10}{'killed':>7}{'restart s':>10}{'stuck':>6}  checks"
    )
    rows = [header]
    for result in results:
        rows.append(
            f"{result.store:<9}{result.workers:>8}{result.sessions:>9}{result.acked:>7}{result.throughput:>9.1f}"
            f"{result.p50_ms:>8.1f}{result.p99_ms:>8.1f}{result.retries:>8}{result.summarizer_calls:>7}"
            f"{result.summaries:>10}{result.calls_per_summary:>10.2f}{result.killed:>7}"
            + (
                f"{result.restart_seconds:>10.2f}"
                if result.restart_seconds is not None
                else f"{'-':>10}"
            )
            + f"{len(result.stuck):>6}  "
            + ("ok" if not result.failures else f"{len(result.failures)} FAILED")
        )
    return "\n".join(rows)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--store", choices=("sqlite", "postgres"), default="sqlite")
    parser.add_argument("--url", help="the store's URL (default: a fresh SQLite file)")
    parser.add_argument("--workers", type=int, nargs="+", default=[4], help="one run for each")
    parser.add_argument("--sessions", type=int, default=200)
    parser.add_argument("--turns", type=int, default=2_000)
    parser.add_argument("--kill", action="store_true", help="SIGKILL one worker mid-run")
    parser.add_argument("--restart-postgres", metavar="CMD", help="restart PostgreSQL mid-run")
    parser.add_argument("--depth", type=int, default=16, help="turns in flight per worker")
    parser.add_argument("--backend", choices=("asyncio", "trio"), default="asyncio")
    parser.add_argument("--seed", type=int)
    parser.add_argument("--json", action="store_true", help=f"write {RESULTS.relative_to(ROOT)}")
    args = parser.parse_args(argv)
    options = FleetOptions(
        sessions=args.sessions,
        turns=args.turns,
        kill=args.kill,
        restart=args.restart_postgres,
        depth=args.depth,
        seed=args.seed,
        backend=args.backend,
    )
    results = []
    with tempfile.TemporaryDirectory(prefix="fleet-store-") as scratch:
        for workers in args.workers:
            if args.url:
                url = args.url
            elif args.store == "sqlite":  # a fresh file for each run
                url = f"sqlite:///{Path(scratch) / f'fleet-{workers}.sqlite3'}"
            else:
                url = os.environ.get("NOUS_SESSION_TEST_POSTGRES", "")
                if not url:
                    parser.error("--store postgres needs --url or NOUS_SESSION_TEST_POSTGRES")
            results.append(run_fleet(url, options, workers=workers))
            print(table(results[-1:]).splitlines()[-1], flush=True)
    print(table(results))
    for result in results:
        for failure in result.failures:
            print(f"FAILED ({result.store}, {result.workers} workers): {failure}")
    if args.json:
        RESULTS.parent.mkdir(parents=True, exist_ok=True)
        RESULTS.write_text(json.dumps([result.to_json() for result in results], indent=2) + "\n")
    return 1 if any(result.failures for result in results) else 0


if __name__ == "__main__":
    sys.exit(main())
