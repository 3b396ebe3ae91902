"""How the PostgreSQL store turns psycopg's errors into its own, and runs pipelined
transactions (shared by :mod:`~nous_session.stores.postgres` and its group commits)."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager, suppress
from typing import Any, TypeVar

import psycopg
from psycopg_pool import ConnectionPool

from nous_session.errors import ConflictError, OutcomeUnknownError, StoreError

__all__ = [
    "commit_errors",
    "commit_failure",
    "describe",
    "errors",
    "one_line",
    "pipelined",
    "pooled",
]

ConnectionT = TypeVar("ConnectionT", bound=psycopg.Connection[Any])


@contextmanager
def errors(what: str) -> Iterator[None]:
    """Translate psycopg's errors, in the one place this store does it.

    A clash on a primary key (another writer holds one of these seqs) is a ConflictError; any
    other database error a StoreError that says what failed (``what``) and why.
    """
    try:
        yield
    except psycopg.errors.UniqueViolation as error:
        raise ConflictError(
            f"{what}: another writer holds one of these seqs ({describe(error)})"
        ) from error
    except psycopg.Error as error:
        raise StoreError(f"{what}: {describe(error)}") from error


@contextmanager
def pooled(
    pool: ConnectionPool[ConnectionT], what: str, *, transaction: bool = False
) -> Iterator[ConnectionT]:
    """A connection of ``pool`` for one job, its errors translated as by :func:`errors`
    (``what`` says what failed); with ``transaction``, the job is one transaction."""
    with errors(what), pool.connection() as connection:
        if not transaction:
            yield connection
            return
        with connection.transaction():
            yield connection


@contextmanager
def pipelined(
    connection: psycopg.Connection[Any], *, begin: str | None = None
) -> Iterator[psycopg.Pipeline]:
    """``connection.pipeline()``, raising a failed statement's error once, and quietly; with
    ``begin`` (``"BEGIN"``, or one with an isolation level), the block's statements are one
    transaction, committed in the same round trip.

    In pipeline mode psycopg raises a failed statement's error at whichever call next reads
    results (an execute, a fetch, a ``transaction()``'s exit), and the server aborts every
    statement queued after it. A block left with those still unread syncs them on its way
    out, fails again ("pipeline aborted"), and psycopg logs ``error ignored terminating
    <psycopg.Pipeline ...>`` on its logger: on stderr, for an application that configured no
    logging, at every taken key or deadlock. ``connection.transaction()`` inside a pipeline
    opens pipelines of its own around the block, which log the same way when the error
    surfaces inside it or at its COMMIT. So the transaction is plain BEGIN and COMMIT
    statements in this one pipeline; an error in the block first reads what the aborted
    statements left, and a failed transaction is rolled back after the pipeline, once.
    """
    try:
        with connection.pipeline() as pipeline:
            try:
                if begin is not None:
                    connection.execute(begin)
                yield pipeline
                if begin is not None:
                    connection.execute("COMMIT")
            except psycopg.Error:
                if not connection.broken:
                    with suppress(psycopg.Error):  # the aborted statements' "pipeline aborted"
                        pipeline.sync()
                raise
    except BaseException:
        if (
            begin is not None
            and not connection.broken
            and connection.info.transaction_status != psycopg.pq.TransactionStatus.IDLE
        ):
            connection.rollback()
        raise


@contextmanager
def commit_errors(session_id: str) -> Iterator[None]:
    """As :func:`errors`, except that losing the connection makes the outcome unknown: the
    server may have committed before the reply was lost."""
    what = f"commit to session {session_id!r} failed"
    try:
        with errors(what):
            yield
    except StoreError as error:
        cause = error.__cause__
        if isinstance(cause, psycopg.OperationalError) and not isinstance(
            cause, psycopg.errors.QueryCanceled | psycopg.errors.LockNotAvailable
        ):
            raise OutcomeUnknownError(
                f"commit to session {session_id!r}: the connection was lost"
                f" ({describe(cause)}); it may or may not have landed"
            ) from cause
        raise


def commit_failure(session_id: str, error: psycopg.Error) -> BaseException:
    """What :func:`commit_errors` makes of ``error`` for a commit to ``session_id``."""
    try:
        with commit_errors(session_id):
            raise error
    except (StoreError, OutcomeUnknownError) as failure:
        return failure
    raise AssertionError("unreachable")  # pragma: no cover


def describe(error: BaseException) -> str:
    return f"{type(error).__name__}: {str(error).strip()}"


def one_line(error: BaseException) -> str:
    """An error as one line: libpq's messages span several."""
    return f"{type(error).__name__}: {' '.join(str(error).split())}"
