"""Child processes for the multi-process store tests (SQLite and PostgreSQL).

    python store_worker.py write URL SESSION NAME PRODUCERS PER_PRODUCER [raise|rebase]
        append PRODUCERS x PER_PRODUCER events, retrying each on ConflictError (with
        "rebase", the actor's on_conflict, a ConflictError is an error); print
        "ack SEQ NAME PRODUCER N" after each acknowledgement, then "done".
    python store_worker.py subscribe URL SESSION EXPECTED
        follow the session from seq 0 through an actor; print "event SEQ CONTENT" for each
        event, then "done" after EXPECTED events.
    python store_worker.py remake URL SESSION COUNT
        delete the session, then make it again with COUNT messages ("new 0" ...) through an
        actor; print "done".

URL is any store URL (``sqlite:///path``, ``postgresql://...?schema=name``).
"""

from __future__ import annotations

import sys

import anyio

from nous_session import ConflictError, Message, SessionActor, open_store


async def write(
    url: str, session_id: str, name: str, producers: int, each: int, mode: str = "raise"
) -> None:
    async with SessionActor.open(session_id=session_id, store=url, on_conflict=mode) as session:
        print("ready", flush=True)

        async def produce(producer: int) -> None:
            for n in range(each):
                content = f"{name} {producer} {n}"
                while True:
                    try:
                        event = await session.append("user_message", {"content": content})
                        break
                    except ConflictError:
                        if mode == "rebase":
                            raise
                        continue  # the actor has caught up with the winner; try again
                print(f"ack {event.seq} {content}", flush=True)

        async with anyio.create_task_group() as tg:
            for producer in range(producers):
                tg.start_soon(produce, producer)
    print("done", flush=True)


async def subscribe(url: str, session_id: str, expected: int) -> None:
    async with SessionActor.open(session_id=session_id, store=url) as session:
        print("ready", flush=True)
        seen = 0
        async with session.subscribe(0) as events:
            async for event in events:
                print(f"event {event.seq} {event.data.get('content')}", flush=True)
                seen += 1
                if seen == expected:
                    break
    print("done", flush=True)


async def remake(url: str, session_id: str, count: int) -> None:
    async with open_store(url) as store:
        assert await store.delete(session_id), f"no session {session_id!r} to delete"
        async with SessionActor.open(session_id=session_id, store=store) as session:
            for n in range(count):
                await session.add_message(Message.user(f"new {n}"))
    print("done", flush=True)


if __name__ == "__main__":
    command, *args = sys.argv[1:]
    if command == "write":
        url, sid, name, producers, each, *mode = args
        anyio.run(write, url, sid, name, int(producers), int(each), *mode)
    elif command == "remake":
        url, sid, count = args
        anyio.run(remake, url, sid, int(count))
    else:
        url, sid, expected = args
        anyio.run(subscribe, url, sid, int(expected))
