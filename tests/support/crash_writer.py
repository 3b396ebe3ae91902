"""A child process for the crash-safety tests: append for ever, print each acknowledged event.

Usage: python crash_writer.py PATH SESSION_ID PRODUCERS [SESSIONS]

With one session (the default) each line printed is ``seq sha256(record)``; with SESSIONS > 1
the sessions are ``SESSION_ID-0`` .. ``SESSION_ID-{SESSIONS-1}`` on one store, PRODUCERS tasks
each, and each line is ``session seq sha256(record)``. A line is written only after the append
was acknowledged (committed with synchronous=FULL). Every 50 acknowledgements a line
``group N`` gives the most commits the store's writer has put in one transaction so far, so
the parent can tell that the kills landed during group commits. The parent kills this process
with SIGKILL at random moments.
"""

from __future__ import annotations

import hashlib
import sys
from contextlib import AsyncExitStack

import anyio

from nous_session import SessionActor
from nous_session.codec import encode
from nous_session.stores.sqlite import SQLiteStore


async def main(path: str, session_id: str, producers: int, sessions: int = 1) -> None:
    async with SQLiteStore(path) as store, AsyncExitStack() as stack:
        names = [session_id] if sessions == 1 else [f"{session_id}-{i}" for i in range(sessions)]
        actors = [
            await stack.enter_async_context(SessionActor.open(session_id=name, store=store))
            for name in names
        ]
        print(f"ready {sum(actor.log.count for actor in actors)}", flush=True)
        acknowledged = 0

        async def produce(actor: SessionActor, index: int) -> None:
            nonlocal acknowledged
            n = 0
            while True:
                n += 1
                event = await actor.append(
                    "user_message",
                    {"content": f"producer {index} message {n} " + "x" * (n % 300)},
                )
                digest = hashlib.sha256(encode(event)).hexdigest()
                prefix = "" if sessions == 1 else f"{actor.session_id} "
                print(f"{prefix}{event.seq} {digest}", flush=True)
                acknowledged += 1
                if acknowledged % 50 == 0:
                    print(f"group {store._writer_thread().statistics().max_group}", flush=True)

        async with anyio.create_task_group() as tg:
            for actor in actors:
                for index in range(producers):
                    tg.start_soon(produce, actor, index)


if __name__ == "__main__":
    anyio.run(main, sys.argv[1], sys.argv[2], *map(int, sys.argv[3:]))
