"""Child processes for the fault-injection suite (tests/faults/test_faults.py).

    python fault_worker.py mixed URL SESSION NAME SEED COUNT
        COUNT keyed appends by NAME (key "NAME-i", content "NAME i"), interleaved at random
        (from SEED) with replaces and removes (conditional), rewinds, snapshots and a
        compaction policy, in rebase mode. Retries a call with the same key after any
        ConflictError, StoreError or OutcomeUnknownError. Prints "ack NAME i SEQ" after each
        acknowledged append. After every step where its log has caught up with the store, it
        checks its surface against a fresh fold of the stored session and exits 3 if they
        differ ("diverged ..."). Prints "done" at the end.
    python fault_worker.py crash URL SESSION SEED
        Appends keyed events for ever with compaction and frequent snapshots, printing
        "ack i SEQ" after each; the parent SIGKILLs it.

URL is any store URL (``sqlite:///path``, ``postgresql://...?schema=name``).
"""

from __future__ import annotations

import random
import sys

import anyio

from nous_session import (
    CompactionPolicy,
    ConflictError,
    InvalidEventError,
    Log,
    Message,
    OutcomeUnknownError,
    SessionActor,
    StoreError,
)
from nous_session.stores import open_store


async def _diverged(session: SessionActor, probe: object) -> str | None:
    stored = await probe.read(session.session_id)  # type: ignore[attr-defined]
    if stored.count != session.log.count:
        return None  # not caught up: nothing to compare yet
    fresh = Log.restore(stored.events, count=stored.count, horizon=stored.horizon)
    mine = [(e.seq, e.position) for e in session.log.surface()]
    theirs = [(e.seq, e.position) for e in fresh.surface()]
    return None if mine == theirs else f"mine {mine} != fresh {theirs}"


async def _keyed(session: SessionActor, name: str, index: int) -> int:
    while True:
        try:
            event = await session.add_message(
                Message.user(f"{name} {index}"), key=f"{name}-{index}"
            )
            return event.seq
        except (ConflictError, StoreError, OutcomeUnknownError):
            await anyio.sleep(0.01)  # the same key again: safe, whatever happened


async def mixed(url: str, session_id: str, name: str, seed: int, count: int) -> None:
    rng = random.Random(seed)
    policy = CompactionPolicy(every=30, keep_last=8)
    probe = open_store(url)
    try:
        async with SessionActor.open(
            session_id=session_id, store=url, on_conflict="rebase", compaction=policy
        ) as session:
            print("ready", flush=True)
            for index in range(count):
                seq = await _keyed(session, name, index)
                print(f"ack {name} {index} {seq}", flush=True)
                roll = rng.random()
                try:
                    surface = session.log.surface()
                    if roll < 0.10 and len(surface) > 2:
                        entry = surface[rng.randrange(len(surface) - 1)]
                        seqs = [e.seq for e in session.log.range(entry.position, entry.position)]
                        await session.replace(
                            entry.position,
                            entry.position,
                            Message.system(f"{name} edit {index}"),
                            expect=seqs[:1],
                        )
                    elif roll < 0.15 and len(surface) > 2:
                        entry = surface[rng.randrange(len(surface) - 1)]
                        await session.remove(entry.position, entry.position, expect=1)
                    elif roll < 0.18:
                        low = max(session.log.horizon - 1, 0)
                        await session.rewind(rng.randrange(low, session.log.count))
                    elif roll < 0.22:
                        await session.snapshot()
                    elif roll < 0.30:
                        await session.reload()
                except (ConflictError, InvalidEventError, StoreError, OutcomeUnknownError):
                    pass  # another writer changed the surface first: that is allowed
                await session.wait_for_compaction()
                problem = await _diverged(session, probe)
                if problem is not None:
                    print(f"diverged {problem}", flush=True)
                    sys.exit(3)
            await session.reload()
            problem = await _diverged(session, probe)
            if problem is not None:
                print(f"diverged {problem}", flush=True)
                sys.exit(3)
    finally:
        await probe.aclose()
    print("done", flush=True)


async def crash(url: str, session_id: str, seed: int) -> None:
    rng = random.Random(seed)
    policy = CompactionPolicy(every=20, keep_last=5)
    async with SessionActor.open(session_id=session_id, store=url, compaction=policy) as session:
        print("ready", flush=True)
        index = 0
        while True:
            seq = await _keyed(session, "c", index)
            print(f"ack {index} {seq}", flush=True)
            index += 1
            if rng.random() < 0.1:
                await session.snapshot()


if __name__ == "__main__":
    command, *args = sys.argv[1:]
    if command == "mixed":
        url, sid, name, seed, count = args
        anyio.run(mixed, url, sid, name, int(seed), int(count))
    else:
        url, sid, seed = args
        anyio.run(crash, url, sid, int(seed))
