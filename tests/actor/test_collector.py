"""The collector: opening, using and closing sessions leaves no reference cycle of ours.

An actor that left cycles behind would make every full collection walk them: in a bot server
that opens and closes sessions all day, those collections are long pauses. So the session's
parts hold one another only one way (or, for the compaction runner, weakly), and the ones that
must point back let go when the session closes. Runs on memory, SQLite and PostgreSQL
(``NOUS_SESSION_TEST_POSTGRES``), on asyncio and trio.
"""

from __future__ import annotations

import gc
import json
import os
import subprocess
import sys
import uuid
from collections import Counter
from pathlib import Path

import anyio
import pytest

import nous_session
from nous_session import CompactionPolicy, Message, SessionActor
from nous_session.stores import MemoryStore
from nous_session.stores.base import Store
from nous_session.stores.sqlite import SQLiteStore

_OURS = str(Path(nous_session.__file__).parent)


def _ours(thing: object) -> bool:
    """Whether ``thing`` is of our making: an instance of a class of ours, or a function,
    coroutine, generator or frame running our code."""
    if type(thing).__module__.startswith("nous_session"):
        return True
    code = getattr(thing, "__code__", None) or getattr(thing, "cr_code", None)
    code = code or getattr(thing, "gi_code", None) or getattr(thing, "ag_code", None)
    code = code or getattr(thing, "f_code", None)
    return code is not None and str(code.co_filename).startswith(_OURS)


def _found() -> tuple[int, list[tuple[str, int]]]:
    """How many objects a collection found in cycles of ours (a cycle holding an object of
    ours), and the commonest kinds of everything it found. Cycles a library left behind on
    its own (a database driver's connection that another test's pool closed meanwhile, say)
    are not ours to count."""
    gc.collect()
    ours = sum(1 for o in gc.garbage if _ours(o))
    kinds = Counter(f"{type(o).__module__}.{type(o).__qualname__}" for o in gc.garbage)
    gc.garbage.clear()
    return ours, kinds.most_common(10)


async def _use(store: Store, session_id: str, compaction: CompactionPolicy | None) -> None:
    async with SessionActor.open(session_id=session_id, store=store, compaction=compaction) as s:
        async with s.subscribe(0) as events:
            await s.add_message(Message.user("hello"))
            await events.__anext__()
        for index in range(6):
            await s.add_message(Message.assistant(f"reply {index}"))
        await s.wait_for_compaction()
        assert s.log.count >= 7


async def _scenario(store: Store, compacting: bool) -> tuple[int, list[tuple[str, int]]]:
    """Use sessions with automatic collection off, and what a collection then finds."""
    policy = CompactionPolicy(keep_last=2, every=4) if compacting else None
    gc.collect()
    gc.disable()
    gc.set_debug(gc.DEBUG_SAVEALL)
    try:
        await _use(store, "warm-up", policy)  # first use: caches, module state, the pool
        _found()
        for index in range(5):
            await _use(store, f"s{index}", policy)
        return _found()
    finally:
        gc.set_debug(0)
        gc.garbage.clear()
        gc.enable()
        await store.aclose()


def _child(kind: str, where: str, loop: str, compacting: bool) -> None:
    """In a process of its own: run the scenario, print what the collection found."""
    if kind == "memory":
        store: Store = MemoryStore()
    elif kind == "sqlite":
        store = SQLiteStore(where)
    else:
        from nous_session.stores.postgres import PostgresStore

        url, schema = where.rsplit(" ", 1)
        store = PostgresStore(url, schema=schema)
    found, kinds = anyio.run(_scenario, store, compacting, backend=loop)
    sys.stdout.write(json.dumps({"found": found, "kinds": kinds}))


@pytest.mark.parametrize("loop", ["asyncio", "trio"])
@pytest.mark.parametrize("compacting", [False, True], ids=["plain", "compacting"])
@pytest.mark.parametrize("kind", ["memory", "sqlite", "postgres"])
def test_open_append_subscribe_compact_close_leaves_no_cycle(
    kind: str, compacting: bool, loop: str, tmp_path: Path
) -> None:
    # In a process of its own: another test's threads (a pool's, a portal's) that end while
    # this one counts would let go of cycles of their own, found here as if they were ours.
    where = str(tmp_path / "collector.sqlite3")
    schema = None
    if kind == "postgres":
        url = os.environ.get("NOUS_SESSION_TEST_POSTGRES")
        if not url:
            pytest.skip("no PostgreSQL server: set NOUS_SESSION_TEST_POSTGRES")
        schema = f"gc_{uuid.uuid4().hex[:12]}"
        where = f"{url} {schema}"
    code = (
        "import sys; from tests.actor.test_collector import _child;"
        f" _child({kind!r}, {where!r}, {loop!r}, {compacting!r})"
    )
    try:
        result = subprocess.run(
            [sys.executable, "-c", code],
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
            cwd=Path(__file__).resolve().parents[2],
        )
    finally:
        if schema is not None:
            import psycopg

            with psycopg.connect(where.rsplit(" ", 1)[0], autocommit=True) as connection:
                connection.execute(f"DROP SCHEMA IF EXISTS {schema} CASCADE")
    assert result.returncode == 0, result.stderr
    counted = json.loads(result.stdout)
    found, kinds = counted["found"], counted["kinds"]
    assert found == 0, f"{found} objects of ours in reference cycles: {kinds}"
