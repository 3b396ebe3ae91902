"""A child process that holds one session with background compaction, for the tests of one
compactor per session across processes (tests/actor/test_fleet_compaction.py).

    python compacting_worker.py URL SESSION TURNS TTL

Opens the session (default options: it follows the store) with a compaction policy of
``keep_last=2, every=TURNS - 1`` and ``turn_ttl=TTL``, appends TURNS user messages ``"w N"`` so
the policy triggers, and prints "ready". Its summarizer prints "summarizing " and the contents
it was given (joined by "|"), then, on its first call only, waits for a line on stdin before
it returns ``"SUMMARY of " + those contents``: the test stops the process (SIGSTOP) while it
waits, so its turn lapses, acts meanwhile, then writes "go" and lets it go on (SIGCONT). On
"stats" the worker waits for its compactions to finish, prints "stats RUN STALE FAILED CALLS"
and closes the session. (One task reads stdin, so no line goes to the wrong reader.)
"""

from __future__ import annotations

import sys
from collections.abc import Sequence

import anyio
import anyio.to_thread

from nous_session import CompactionPolicy, Message, SessionActor


async def main(url: str, session_id: str, turns: int, ttl: float) -> None:
    calls = 0
    go = anyio.Event()

    async def summarize(messages: Sequence[Message]) -> str:
        nonlocal calls
        calls += 1
        contents = "|".join(message.text for message in messages)
        print(f"summarizing {contents}", flush=True)
        if calls == 1:
            await go.wait()
        return f"SUMMARY of {contents}"

    policy = CompactionPolicy(keep_last=2, every=turns - 1, summarizer=summarize, turn_ttl=ttl)
    async with SessionActor.open(session_id=session_id, store=url, compaction=policy) as chat:
        for turn in range(turns):
            await chat.add_message(Message.user(f"w {turn}"))
        print("ready", flush=True)
        while (line := await anyio.to_thread.run_sync(sys.stdin.readline)) == "go\n":
            go.set()
        assert line == "stats\n", line
        await chat.wait_for_compaction()
        stats = chat.statistics()
        print(
            f"stats {stats.compactions_run} {stats.compactions_stale} "
            f"{stats.compactions_failed} {calls}",
            flush=True,
        )


if __name__ == "__main__":
    anyio.run(main, sys.argv[1], sys.argv[2], int(sys.argv[3]), float(sys.argv[4]))
