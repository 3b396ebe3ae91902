"""A child process for the crash-safety test: append for ever, print each acknowledged event.

Usage: python crash_writer.py PATH SESSION_ID PRODUCERS

Each line printed is ``seq sha256(record)``, written only after the append was acknowledged
(committed with synchronous=FULL). The parent kills this process with SIGKILL at random moments.
"""

from __future__ import annotations

import hashlib
import sys

import anyio

from nous_session import SessionActor
from nous_session.codec import encode
from nous_session.stores.sqlite import SQLiteStore


async def main(path: str, session_id: str, producers: int) -> None:
    async with (
        SQLiteStore(path) as store,
        SessionActor.open(session_id=session_id, store=store) as s,
    ):
        print(f"ready {s.log.count}", flush=True)

        async def produce(index: int) -> None:
            n = 0
            while True:
                n += 1
                event = await s.append(
                    "user_message",
                    {"content": f"producer {index} message {n} " + "x" * (n % 300)},
                )
                digest = hashlib.sha256(encode(event)).hexdigest()
                print(f"{event.seq} {digest}", flush=True)

        async with anyio.create_task_group() as tg:
            for index in range(producers):
                tg.start_soon(produce, index)


if __name__ == "__main__":
    anyio.run(main, sys.argv[1], sys.argv[2], int(sys.argv[3]))
