"""The fleet soak, short (issue 33; the long form is ``benchmarks/fleet.py`` and ``make bench``'s
``fleet`` suite): 4 worker processes, each a ``Sessions`` registry with compaction on and a
counting summarizer, on one SQLite file and on one PostgreSQL schema; 20 sessions, 300 turns,
each routed to a random worker; one worker killed with SIGKILL about 40% through and started
again, its unacknowledged turns sent again with the same idempotency keys. The PostgreSQL run
also restarts the server about 60% through when ``NOUS_SESSION_TEST_PG_RESTART`` holds a shell
command that does so (the shared test server is never restarted otherwise).

Checked (by :func:`benchmarks.fleet.run_fleet`): every acknowledged turn stored exactly once, at
the seq it was acknowledged at; every worker holds a prefix of what the store holds, byte for
byte; every session opens; at most 1.1 summarizer calls per committed summary; no call left
unanswered. Every wait is bounded (a deadline for the run, a give-up time for a failing turn,
a time after which a worker gives a call up as stuck), and fails with what it was waiting for.

The soak found a bug in the actor, pinned by
:func:`test_a_known_key_beside_a_losing_commit_is_answered`: a keyed append whose key the actor
already knows, taken in one batch with a new append whose commit loses to another writer, was
never answered. In the soak that is a turn sent again after the kill (its first send committed,
its ack lost) that shares a batch with another turn of its session; it hung about one
PostgreSQL run in ten. Fixed (the segment applied again answers the requests its keys
answered); a call left unanswered now fails the soak.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import quote

import anyio
import pytest

from benchmarks.fleet import FleetOptions, FleetResult, run_fleet
from nous_session import Message, SessionActor
from nous_session.stores import MemoryStore

pytestmark = [pytest.mark.faults]
POSTGRES_URL = os.environ.get("NOUS_SESSION_TEST_POSTGRES")
RESTART = os.environ.get("NOUS_SESSION_TEST_PG_RESTART")
SHORT = FleetOptions(
    workers=4,
    sessions=20,
    turns=300,
    kill=True,
    give_up=20.0,
    stuck_after=15.0 if RESTART else 5.0,  # a restart may hold commits up for seconds
    deadline=50.0,
    seed=33,
)


def check(result: FleetResult) -> None:
    problems = "\n".join(result.failures)
    assert not result.failures, f"the soak's checks failed:\n{problems}"
    assert result.acked == SHORT.turns
    assert result.killed == 1
    assert result.summaries > 0, "no session was compacted: the soak did not test compaction"
    assert result.followers_checked > 0, "no worker reported what it holds"
    assert not result.stuck, f"calls left unanswered: {result.stuck}"


def test_fleet_soak_sqlite(tmp_path: Path) -> None:
    check(run_fleet(f"sqlite:///{tmp_path / 'fleet.sqlite3'}", SHORT))


@pytest.fixture
def postgres_url() -> Iterator[str]:
    """The test server's URL with a schema of this test's own, dropped afterwards."""
    if not POSTGRES_URL:
        pytest.skip("no PostgreSQL server: set NOUS_SESSION_TEST_POSTGRES=postgresql://...")
    import psycopg

    schema = f"t_fleet_{uuid.uuid4().hex[:12]}"
    separator = "&" if "?" in POSTGRES_URL else "?"
    yield f"{POSTGRES_URL}{separator}schema={schema}"
    with psycopg.connect(POSTGRES_URL, autocommit=True) as connection:
        connection.execute(f"DROP SCHEMA IF EXISTS {schema} CASCADE")


def test_fleet_soak_postgres(postgres_url: str) -> None:
    result = run_fleet(postgres_url, SHORT, restart=RESTART)
    check(result)
    if RESTART:
        assert result.restart_seconds is not None, "the server was not restarted"


def test_fleet_soak_through_pgbouncer(postgres_url: str) -> None:
    """The same fleet with every commit and read going through PgBouncer in transaction
    pooling mode (``NOUS_SESSION_TEST_PGBOUNCER``, started by ``.ci/pgbouncer``), the change
    feed on the direct URL; the server restarted under it too when the environment says how."""
    pgbouncer = os.environ.get("NOUS_SESSION_TEST_PGBOUNCER")
    if not pgbouncer:
        pytest.skip("no PgBouncer: set NOUS_SESSION_TEST_PGBOUNCER=postgresql://...")
    schema = postgres_url.rsplit("schema=", 1)[1]
    direct = quote(str(POSTGRES_URL), safe="")
    separator = "&" if "?" in pgbouncer else "?"
    url = f"{pgbouncer}{separator}schema={schema}&pooled=true&direct_url={direct}"
    result = run_fleet(url, SHORT, restart=RESTART)
    check(result)
    if RESTART:
        assert result.restart_seconds is not None, "the server was not restarted"


@pytest.mark.anyio
async def test_a_known_key_beside_a_losing_commit_is_answered() -> None:
    """A retried keyed append (its key committed already) queued in one batch with a new
    append, on an actor whose count another writer has moved: the batch's commit conflicts,
    and the retry must still get the events first committed under its key."""
    store = MemoryStore()
    async with (
        SessionActor.open(session_id="s", store=store, follow=False) as behind,
        SessionActor.open(session_id="s", store=store, follow=False) as other,
    ):
        first = await behind.add_message(Message.user("first"), key="K")
        await other.reload()
        await other.add_message(Message.user("another writer's"))  # behind's count is stale
        answers: dict[str, int] = {}

        async def add(text: str, key: str) -> None:
            answers[key] = (await behind.add_message(Message.user(text), key=key)).seq

        with anyio.fail_after(2):  # answered at once when right; the bug never answers
            async with anyio.create_task_group() as group:  # both queued before the actor runs
                group.start_soon(add, "new", "N")
                group.start_soon(add, "first, sent again", "K")
        assert answers == {"N": 2, "K": first.seq}
