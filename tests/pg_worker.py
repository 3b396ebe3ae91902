"""Child processes for the PostgreSQL tests.

python pg_worker.py write URL SCHEMA SESSION NAME PRODUCERS PER_PRODUCER
    append PRODUCERS x PER_PRODUCER events, retrying each on ConflictError; print
    "ack SEQ NAME PRODUCER N" after each acknowledgement, then "done".
python pg_worker.py subscribe URL SCHEMA SESSION EXPECTED
    follow the session from seq 0 through an actor; print "event SEQ CONTENT" for each
    event, then "done" after EXPECTED events.
"""

from __future__ import annotations

import sys

import anyio

from nous_session import ConflictError, SessionActor
from nous_session.stores.postgres import PostgresStore


async def write(
    url: str, schema: str, session_id: str, name: str, producers: int, each: int
) -> None:
    async with PostgresStore(url, schema=schema, max_size=4) as store:
        async with SessionActor.open(session_id=session_id, store=store) as session:
            print("ready", flush=True)

            async def produce(producer: int) -> None:
                for n in range(each):
                    content = f"{name} {producer} {n}"
                    while True:
                        try:
                            event = await session.append("user_message", {"content": content})
                            break
                        except ConflictError:
                            continue  # the actor has caught up with the winner; try again
                    print(f"ack {event.seq} {content}", flush=True)

            async with anyio.create_task_group() as tg:
                for producer in range(producers):
                    tg.start_soon(produce, producer)
    print("done", flush=True)


async def subscribe(url: str, schema: str, session_id: str, expected: int) -> None:
    async with PostgresStore(url, schema=schema) as store:
        async with SessionActor.open(session_id=session_id, store=store) as session:
            print("ready", flush=True)
            seen = 0
            async with session.subscribe(0) as events:
                async for event in events:
                    print(f"event {event.seq} {event.data.get('content')}", flush=True)
                    seen += 1
                    if seen == expected:
                        break
    print("done", flush=True)


if __name__ == "__main__":
    command, *args = sys.argv[1:]
    if command == "write":
        url, schema, sid, name, producers, each = args
        anyio.run(write, url, schema, sid, name, int(producers), int(each))
    else:
        url, schema, sid, expected = args
        anyio.run(subscribe, url, schema, sid, int(expected))
