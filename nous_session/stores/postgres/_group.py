"""Group commit for the PostgreSQL store: the commits an event loop's tasks send in one round
go to the server as one transaction (see :mod:`nous_session.stores.postgres`)."""

from __future__ import annotations

import functools
import threading
from collections.abc import Awaitable, Callable, Sequence
from typing import Any, ClassVar

import anyio
import anyio.lowlevel
import psycopg
from psycopg import sql
from psycopg_pool import ConnectionPool

from nous_session._loops import Done
from nous_session.codec import encode
from nous_session.errors import ConflictError, OutcomeUnknownError, StoreError
from nous_session.event import Event
from nous_session.stores.postgres._commit import conflict
from nous_session.stores.postgres._errors import commit_errors, commit_failure, describe, pipelined
from nous_session.stores.postgres._sql import Statements

__all__ = ["GroupCommits", "Grouped"]


class Grouped:
    """One commit waiting in a round of grouped commits (see :meth:`GroupCommits.commit`).

    The round's first caller runs the group and sets ``done``; ``error`` is what its caller
    raises (None: the commit landed, into the session whose identity is ``uid``).
    """

    __slots__ = ("done", "error", "parameters", "rows", "sealer", "session_id", "statement", "uid")

    def __init__(
        self,
        session_id: str,
        statement: sql.Composed,
        parameters: dict[str, Any],
        rows: list[Event],
        sealer: Callable[[Sequence[Event]], list[bytes]] | None = None,
    ) -> None:
        self.session_id = session_id
        self.statement = statement
        self.parameters = parameters
        self.rows = rows
        self.sealer = sealer  # seals the records (a store that encrypts), else None
        # The event loop's own primitive, not an anyio.Event (which looks the backend up and
        # builds an asyncio.Event per commit): set and awaited on the loop's thread.
        self.done = Done()
        self.error: BaseException | None = None
        self.uid = ""


class GroupCommits:
    """The rounds of grouped commits of one store.

    Args:
        pool: the store's connection pool.
        statements: the store's SQL.
        channel: the NOTIFY channel of the store's schema.
        run: how the store runs a blocking function in a worker thread.
        max_size: the pool's size.

    Attributes:
        transactions: groups of more than one commit sent in one transaction (for tests and
            benchmarks).
        commits_sent: the commits those groups held.
    """

    groups_in_flight: ClassVar[int] = 2
    """The most group transactions of one store running at once (at most the pool's size):
    one can be on the wire while another's commit is flushed; the rest of the pool serves
    reads and lone commits."""

    def __init__(
        self,
        pool: ConnectionPool,
        statements: Statements,
        channel: str,
        run: Callable[[Callable[[], None]], Awaitable[None]],
        max_size: int,
    ) -> None:
        self._pool = pool
        self._sql = statements
        self._channel = channel
        self._run = run
        self._max_size = max_size
        # The slots of group transactions in flight (see groups_in_flight).
        self._group_slots: anyio.CapacityLimiter | None = None
        # Commits sent in one round (one pass of an event loop's ready tasks), by the thread
        # that runs the loop; the round's first caller commits them in one transaction.
        self._rounds: dict[int, list[Grouped]] = {}
        self.transactions = 0
        self.commits_sent = 0

    async def commit(self, item: Grouped) -> str:
        """Commit ``item`` in one transaction with every commit sent in the same round; returns
        the identity (uid) of the session it went into, which the statement reads back.

        Each commit is one autocommitted statement on its own connection otherwise: one
        transaction, one WAL flush and one NOTIFY each, and PostgreSQL serialises the commits
        of notifying transactions. The first caller of a round yields once (not cancellable),
        so that the loop's other ready tasks (typically every session one group just woke)
        add theirs; then it runs them all, pipelined, in one transaction on one pooled
        connection: one round trip, one WAL flush. A statement that fails there (a key or
        commit id taken, a deadlock) rolls the whole group back, and each of its commits is
        sent again alone, so that one session's failure never fails another's; a connection
        lost makes every commit of the group's outcome unknown, as for one commit. A count or
        horizon conflict is no error: the statement writes nothing and that commit alone
        gets its ConflictError.

        Cancellation does not take a commit back: a caller cancelled while its round runs
        has its commit committed (or failed) all the same.
        """
        loop = threading.get_ident()  # one event loop per thread: its rounds are its own
        pending = self._rounds.get(loop)
        if pending is not None:
            pending.append(item)
            await item.done.wait()
        else:
            group = self._rounds[loop] = [item]
            slots = self._group_slots
            if slots is None:
                slots = self._group_slots = anyio.CapacityLimiter(
                    min(self._max_size, self.groups_in_flight)
                )
            try:
                await anyio.lowlevel.cancel_shielded_checkpoint()
                # While this store's group transactions in flight are at their cap, the round
                # stays open: the commits sent meanwhile join this group instead of each
                # forming a small one of its own (the commits of notifying transactions are
                # serialised by the server anyway: more of them at once do not flush faster).
                with anyio.CancelScope(shield=True):
                    await slots.acquire()
            finally:
                del self._rounds[loop]
            try:
                with anyio.CancelScope(shield=True):
                    await self._run(functools.partial(self._commit_group, group))
            except BaseException as error:  # closed, cannot connect, or a bug: all hear it
                message = str(error) if isinstance(error, StoreError) else describe(error)
                for other in group[1:]:
                    other.error = StoreError(f"commit to session {other.session_id!r}: {message}")
                    other.error.__cause__ = error
                raise
            finally:
                slots.release()
                for other in group:
                    other.done.set()
        if item.error is not None:
            failure, item.error = item.error, None
            raise failure
        return item.uid

    def _commit_group(self, group: list[Grouped]) -> None:
        """On a worker thread: commit ``group`` in one transaction (see :meth:`commit`)."""
        for item in group:
            item.parameters["seqs"] = [event.seq for event in item.rows]
            item.parameters["records"] = (
                [encode(event) for event in item.rows]
                if item.sealer is None
                else item.sealer(item.rows)
            )
        if len(group) == 1:
            self._commit_alone(group[0])
            return
        # Every transaction takes its sessions' row locks in one order: two groups (of two
        # processes) cannot deadlock on each other. The sort is stable: two commits to one
        # session keep their order.
        ordered = sorted(group, key=lambda item: item.session_id)
        # The common commits go as one statement (when their sessions are distinct); the rest
        # (a session's first commit, one that sets a horizon) one statement each, pipelined.
        common = [
            item
            for item in ordered
            if item.statement is self._sql.commit
            and item.parameters["horizon"] is None
            and item.parameters["meta"] is None
        ]
        if len(common) < 2 or len({item.session_id for item in common}) < len(common):
            common = []
        chosen = {id(item) for item in common}
        alone = [item for item in ordered if id(item) not in chosen]
        broken = False
        try:
            with self._pool.connection() as connection:
                try:
                    with pipelined(connection, begin="BEGIN"):
                        if common:
                            moving = connection.execute(
                                self._sql.group_commit, self._group_parameters(common)
                            )
                        cursors = [
                            connection.execute(item.statement, item.parameters) for item in alone
                        ]
                    moved = {row[0]: row[1] for row in moving.fetchall()} if common else {}
                    found = [cursor.fetchone() for cursor in cursors]
                except psycopg.Error:
                    broken = connection.broken
                    raise
            self.transactions += 1
            self.commits_sent += len(ordered)
        except psycopg.Error as error:
            if broken or isinstance(error, psycopg.errors.ConnectionTimeout):
                for item in ordered:
                    item.error = commit_failure(item.session_id, error)
                return
            # The transaction was rolled back: nothing of the group landed. Each commit alone.
            for item in ordered:
                self._commit_alone(item)
            return
        for item in common:
            uid = moved.get(item.session_id)
            if uid is None:
                item.error = self._conflict(item)
            else:
                item.uid = uid
        for item, row in zip(alone, found, strict=True):
            if row is None:
                item.error = self._conflict(item)
            else:
                item.uid = row[0]

    def _group_parameters(self, common: list[Grouped]) -> dict[str, Any]:
        """The arrays of the group commit statement for ``common``: one entry per commit,
        event, key and commit id."""
        names, expected, counts, expected_horizons, payloads, kids = [], [], [], [], [], []
        expected_uids: list[str | None] = []
        event_sessions: list[str] = []
        seqs: list[int] = []
        records: list[bytes] = []
        key_sessions: list[str] = []
        key_names: list[str] = []
        key_seqs: list[int] = []
        key_sizes: list[int] = []
        commit_sessions, commit_ids, firsts, sizes = [], [], [], []
        for item in common:
            name, parameters = item.session_id, item.parameters
            names.append(name)
            expected.append(parameters["expected"])
            counts.append(parameters["count"])
            expected_horizons.append(parameters["expected_horizon"])
            payloads.append(parameters["payload"])
            kids.append(parameters["kid"])
            expected_uids.append(parameters["expected_uid"])
            event_sessions += [name] * len(parameters["seqs"])
            seqs += parameters["seqs"]
            records += parameters["records"]
            key_sessions += [name] * len(parameters["key_names"])
            key_names += parameters["key_names"]
            key_seqs += parameters["key_seqs"]
            key_sizes += parameters["key_sizes"]
            if parameters["commit_id"] is not None:
                commit_sessions.append(name)
                commit_ids.append(parameters["commit_id"])
                firsts.append(parameters["first"])
                sizes.append(parameters["size"])
        return {
            "names": names,
            "expected": expected,
            "counts": counts,
            "expected_horizons": expected_horizons,
            "payloads": payloads,
            "kids": kids,
            "expected_uids": expected_uids,
            "event_sessions": event_sessions,
            "seqs": seqs,
            "records": records,
            "key_sessions": key_sessions,
            "key_names": key_names,
            "key_seqs": key_seqs,
            "key_sizes": key_sizes,
            "commit_sessions": commit_sessions,
            "commit_ids": commit_ids,
            "firsts": firsts,
            "sizes": sizes,
            "channel": self._channel,
        }

    def _commit_alone(self, item: Grouped) -> None:
        """One commit as one autocommitted statement; its outcome into ``item.error``."""
        try:
            with commit_errors(item.session_id), self._pool.connection() as connection:
                row = connection.execute(item.statement, item.parameters).fetchone()
        except (StoreError, OutcomeUnknownError) as error:
            item.error = error
            return
        if row is None:
            item.error = self._conflict(item)
        else:
            item.uid = row[0]

    @staticmethod
    def _conflict(item: Grouped) -> ConflictError:
        parameters = item.parameters
        return conflict(
            item.session_id,
            parameters["expected"],
            parameters["expected_horizon"],
            parameters["expected_uid"],
        )
