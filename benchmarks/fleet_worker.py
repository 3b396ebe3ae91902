"""One worker process of the fleet soak (:mod:`benchmarks.fleet` starts and drives it).

``python benchmarks/fleet_worker.py URL NAME CALLS_FILE [--summary-delay S] [--turn-ttl S]
[--stuck-after S] [--backend asyncio|trio]``

It runs one :class:`~nous_session.Sessions` registry on the store at ``URL`` with the default
options and a compaction policy (``keep_last=4, every=12``) whose summarizer stands for an LLM
call: it sleeps ``--summary-delay`` seconds, writes a line to ``CALLS_FILE`` (appended and
flushed at once, so calls made by a worker that is killed later still count) and returns a
text that starts with :data:`SUMMARY_MARK`, so the checks can tell summaries from turns.

It reads turns from stdin, one JSON object a line (``{"id", "session", "text"}``), and handles
each in a task of its own: ``add_message(Message.user(text), key=id)``, the idempotency key
making a retry of a turn whose outcome was lost exactly-once. For each it writes one JSON
line: ``{"ack": id, "seq": seq, "latency": seconds}`` or ``{"error": id, "kind": name,
"retry": bool, "message": text}`` (``retry``: the outcome is unknown or the store failed, so
the coordinator sends the turn again), or ``{"stuck": id}`` when the call had no answer after
``--stuck-after`` seconds (the call is abandoned; the request stays queued in the actor).
The first line is ``{"ready": NAME}``, once the registry is open. When stdin closes it waits
for its turns, then for every session it touched to catch up with the store and finish
compacting, and writes ``{"done": NAME, "calls": n, "follow": {session: [count, sha256 of the
encoded events with seq < count]}}``: what it holds, for the coordinator to compare with the
store.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import anyio
import anyio.abc
import orjson

# Run as a script, sys.path[0] is benchmarks/: the library comes from the checkout's root.
ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from nous_session import (  # noqa: E402
    CompactionPolicy,
    Event,
    Message,
    OutcomeUnknownError,
    StoreError,
)
from nous_session.codec import encode  # noqa: E402
from nous_session.registry import Sessions  # noqa: E402

SUMMARY_MARK = "fleet-summary"
KEEP_LAST, EVERY = 4, 12


def digest(events: Sequence[Event], count: int) -> str:
    """The sha256 of the encoded events with seq < ``count``, in seq order: two holders of a
    session agree on its first ``count`` events exactly when their digests match."""
    hashed = hashlib.sha256()
    for event in events:
        if event.seq < count:
            hashed.update(encode(event))
            hashed.update(b"\n")
    return hashed.hexdigest()


class Worker:
    """The registry, the counting summarizer and the output of one worker process."""

    def __init__(
        self, url: str, name: str, calls_file: Path, delay: float, ttl: float, stuck_after: float
    ) -> None:
        self.url = url
        self.name = name
        self.delay = delay
        self.ttl = ttl
        self.stuck_after = stuck_after
        self.calls = 0
        self.touched: set[str] = set()
        # Unbuffered appends: a line is in the file as soon as the call is counted.
        self._calls_fd = os.open(calls_file, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)

    async def summarize(self, messages: Sequence[Message]) -> str:
        await anyio.sleep(self.delay)  # what an LLM call would take, roughly
        self.calls += 1
        os.write(self._calls_fd, f"{self.name} {self.calls}\n".encode())
        return f"{SUMMARY_MARK} by {self.name}, call {self.calls}: {len(messages)} messages"

    @staticmethod
    def say(**fields: Any) -> None:
        sys.stdout.buffer.write(orjson.dumps(fields) + b"\n")
        sys.stdout.flush()

    async def turn(self, sessions: Sessions, turn: dict[str, str]) -> None:
        started = time.perf_counter()
        event: Event | None = None
        try:
            with anyio.move_on_after(self.stuck_after):
                async with sessions.use(turn["session"]) as actor:
                    event = await actor.add_message(Message.user(turn["text"]), key=turn["id"])
        except (OutcomeUnknownError, StoreError) as error:
            self.say(error=turn["id"], kind=type(error).__name__, retry=True, message=str(error))
        except Exception as error:  # reported to the coordinator, which fails the run
            self.say(error=turn["id"], kind=type(error).__name__, retry=False, message=str(error))
        else:
            if event is None:
                self.say(stuck=turn["id"])
            else:
                self.say(ack=turn["id"], seq=event.seq, latency=time.perf_counter() - started)

    async def follow_report(self, sessions: Sessions) -> dict[str, list[Any]]:
        """Each touched session, caught up and compacted: its count and digest."""
        report: dict[str, list[Any]] = {}
        for session_id in sorted(self.touched):
            async with sessions.use(session_id) as actor:
                await actor.wait_for_compaction()
                log = await actor.reload()
                report[session_id] = [log.count, digest(log.events(), log.count)]
        return report

    async def run(self) -> None:
        policy = CompactionPolicy(
            keep_last=KEEP_LAST, every=EVERY, summarizer=self.summarize, turn_ttl=self.ttl
        )
        async with Sessions(self.url, compaction=policy) as sessions:
            self.say(ready=self.name, pid=os.getpid())
            async with anyio.create_task_group() as task_group:
                while line := await anyio.to_thread.run_sync(sys.stdin.readline):
                    turn = orjson.loads(line)
                    self.touched.add(turn["session"])
                    task_group.start_soon(self.turn, sessions, turn)
            follow = await self.follow_report(sessions)
        os.close(self._calls_fd)
        self.say(done=self.name, calls=self.calls, follow=follow)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("url")
    parser.add_argument("name")
    parser.add_argument("calls_file", type=Path)
    parser.add_argument("--summary-delay", type=float, default=0.02)
    parser.add_argument("--turn-ttl", type=float, default=30.0)
    parser.add_argument("--stuck-after", type=float, default=15.0)
    parser.add_argument("--backend", choices=("asyncio", "trio"), default="asyncio")
    args = parser.parse_args()
    worker = Worker(
        args.url,
        args.name,
        args.calls_file,
        args.summary_delay,
        args.turn_ttl,
        args.stuck_after,
    )
    anyio.run(worker.run, backend=args.backend)


if __name__ == "__main__":
    main()
