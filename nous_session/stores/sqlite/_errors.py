"""How the SQLite store translates sqlite3's errors, and its write transactions."""

from __future__ import annotations

import sqlite3
from collections.abc import Iterator
from contextlib import contextmanager

from nous_session.errors import ConflictError, StoreError


def describe(error: BaseException) -> str:
    return f"{type(error).__name__}: {error}"


@contextmanager
def translated_errors(what: str) -> Iterator[None]:
    """Translate sqlite3's errors, in the one place this store does it.

    A clash on a primary key (another writer holds one of these seqs, or the key) is a
    ConflictError; any other sqlite3 error a StoreError that says what failed and why.
    """
    try:
        yield
    except sqlite3.Error as error:
        raise translated_error(error, what) from error


def translated_error(error: sqlite3.Error, what: str) -> StoreError:
    """The error :func:`translated_errors` raises for ``error``."""
    if isinstance(error, sqlite3.IntegrityError):
        return ConflictError(
            f"{what}: another writer holds one of these seqs or keys ({describe(error)})"
        )
    return StoreError(f"{what}: {describe(error)}")


@contextmanager
def _write(connection: sqlite3.Connection, what: str) -> Iterator[None]:
    """One write transaction, its errors translated."""
    with translated_errors(what), immediate_transaction(connection):
        yield


@contextmanager
def immediate_transaction(connection: sqlite3.Connection) -> Iterator[None]:
    """BEGIN IMMEDIATE (take the write lock now), then COMMIT, or ROLLBACK on any error."""
    connection.execute("BEGIN IMMEDIATE")
    try:
        yield
    except BaseException:
        if connection.in_transaction:
            connection.execute("ROLLBACK")
        raise
    connection.execute("COMMIT")
