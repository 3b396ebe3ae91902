"""A worker process of ``many.sessions_postgres``: open SESSIONS sessions on the store, print
"ready", wait for "go" on stdin, then have each await EACH appends in order; print "done".

    python _many_worker.py URL PREFIX SESSIONS EACH [grouped|pool] [cpu]

``pool`` turns the PostgreSQL store's cross-session group commit off (each commit its own
autocommitted statement on a pooled connection), for the side-by-side comparison. ``cpu``
prints "cpu <microseconds>" after "done": the process's CPU per append from "go" to "done".
"""

from __future__ import annotations

import sys
import time
from contextlib import AsyncExitStack

import anyio
import anyio.to_thread

from nous_session import EventType, SessionActor
from nous_session.stores import open_store


async def main(
    url: str, prefix: str, sessions: int, each: int, mode: str, report_cpu: bool
) -> None:
    payload = {"content": "x" * 200}
    store = open_store(url)
    if mode == "pool":
        store._group_commits = False  # type: ignore[attr-defined]
    try:
        async with AsyncExitStack() as stack:
            actors = [
                await stack.enter_async_context(
                    SessionActor.open(session_id=f"{prefix}-{i}", store=store, follow=False)
                )
                for i in range(sessions)
            ]
            await actors[0].append(EventType.USER_MESSAGE, {"content": "warm"})
            print("ready", flush=True)
            await anyio.to_thread.run_sync(sys.stdin.readline)
            cpu = time.process_time()

            async def produce(actor: SessionActor) -> None:
                for _ in range(each):
                    await actor.append(EventType.USER_MESSAGE, payload)

            async with anyio.create_task_group() as task_group:
                for actor in actors:
                    task_group.start_soon(produce, actor)
            print("done", flush=True)
            if report_cpu:
                per_append = (time.process_time() - cpu) / (sessions * each) * 1e6
                print(f"cpu {per_append:.1f}", flush=True)
    finally:
        await store.aclose()


if __name__ == "__main__":
    url, prefix, sessions, each = sys.argv[1:5]
    options = sys.argv[5:]
    mode = options[0] if options else "grouped"
    anyio.run(main, url, prefix, int(sessions), int(each), mode, "cpu" in options[1:])
