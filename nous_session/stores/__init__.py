"""Stores: where a session's log is persisted.

``Store`` is the contract (:mod:`nous_session.stores.base`), and ``RebasingStore`` its optional
extension for many writers on one session; ``MemoryStore`` is the in-process
reference; ``SQLiteStore`` is the embedded default; ``PostgresStore`` (the ``postgres`` extra)
serves many processes and machines. :func:`open_store` picks one from a URL, importing the
backend only when it is asked for.
"""

from __future__ import annotations

import os
from collections.abc import AsyncGenerator
from contextlib import aclosing
from typing import Final

import anyio

from nous_session.event import Event
from nous_session.stores._copy import CopyError, CopyReport, copy_sessions
from nous_session.stores._followed import Followed
from nous_session.stores.base import (
    FollowingStore,
    ForkingStore,
    LeasingStore,
    ListingStore,
    OutcomeStore,
    Rebased,
    RebasingStore,
    SessionInfo,
    Store,
    Stored,
    supports,
)
from nous_session.stores.memory import MemoryStore

__all__ = [
    "STORE_ENV",
    "CopyError",
    "CopyReport",
    "ForkingStore",
    "LeasingStore",
    "ListingStore",
    "MemoryStore",
    "OutcomeStore",
    "Rebased",
    "RebasingStore",
    "SessionInfo",
    "Store",
    "Stored",
    "copy_sessions",
    "follow",
    "open_store",
]

STORE_ENV: Final = "NOUS_SESSION_STORE"
"""The environment variable that names the store wherever a store is given none: the library
(:func:`open_store` with no URL, ``SessionActor.open`` with no store, the framework adapters)
and the ``nous-session`` command line. Unset, the library keeps sessions in memory."""


def open_store(url: str | None = None, *, read_only: bool = False, **options: object) -> Store:
    """Make the store a URL names; nothing is opened until first use.

    * ``memory:`` -> :class:`MemoryStore`
    * ``sqlite:///relative/path``, ``sqlite:////absolute/path``, ``sqlite:///:memory:`` ->
      :class:`~nous_session.stores.sqlite.SQLiteStore`
    * ``postgresql://...`` (or ``postgres://``) ->
      :class:`~nous_session.stores.postgres.PostgresStore` (needs the ``postgres`` extra)

    With no URL, the store ``$NOUS_SESSION_STORE`` names when it is set, else ``memory:``: the
    one rule for a store given none, everywhere (see :data:`STORE_ENV`). ``read_only=True``
    opens the store for inspecting only: nothing is created or changed, and a missing store is
    an error (a memory store is empty, so it reads as such). ``options`` go to the store's
    constructor (``synchronous="NORMAL"``, ``min_size=...``, ``encryption=Encryption(provider)``
    for the SQL stores: see :mod:`nous_session.encryption`).

    Raises:
        ValueError: the URL's scheme is unknown, or the URL is malformed.
    """
    if url is None:
        url = os.environ.get(STORE_ENV) or "memory:"
    if not isinstance(url, str):
        raise ValueError(f"a store URL must be a string, got {url!r}")
    scheme, sep, rest = url.partition(":")
    if not sep:
        raise ValueError(f"not a store URL (no scheme): {url!r}; try memory:, sqlite:///path")
    scheme = scheme.lower()
    if scheme == "memory":
        if "encryption" in options:
            raise ValueError(
                "memory: holds nothing at rest, so it takes no encryption= (use a sqlite:/// or"
                " postgresql:// store)"
            )
        if options:
            raise ValueError(f"memory: takes no options, got {sorted(options)}")
        if rest not in ("", "//"):
            raise ValueError(f"memory: takes no path, got {url!r}")
        return MemoryStore()
    if scheme == "sqlite":
        if not rest.startswith("///") or len(rest) == 3:
            raise ValueError(
                f"a SQLite URL is sqlite:///relative/path or sqlite:////absolute/path, got {url!r}"
            )
        from nous_session.stores.sqlite import SQLiteStore

        # The options are the store's own keyword arguments, checked by its constructor.
        return SQLiteStore(rest[3:], read_only=read_only, **options)  # type: ignore[arg-type]
    if scheme in ("postgresql", "postgres"):
        from nous_session.stores.postgres import PostgresStore

        # As for SQLite: the constructor checks the options.
        return PostgresStore(url, read_only=read_only, **options)  # type: ignore[arg-type]
    raise ValueError(
        f"unknown store URL scheme {scheme!r} in {url!r}; known: memory:, sqlite:///, postgresql://"
    )


async def follow(
    store: Store, session_id: str, *, since: int = 0, interval: float = 0.2
) -> AsyncGenerator[Event, None]:
    """Yield a session's stored events from ``since`` on, then new ones as other processes
    commit them, for ever (until cancelled).

    A store with its own change feed (a :class:`~nous_session.stores.base.FollowingStore`, as
    PostgreSQL's LISTEN/NOTIFY gives) is used as is; any other store is polled every
    ``interval`` seconds with ``read(since=cursor)``, which costs one indexed range read per
    poll.

    Raises:
        SessionDeletedError: the session was deleted, or deleted and made again under its id,
            while it was followed: the stream ends there (the new session's events are not
            this one's). A store that gives no identity (``Stored.uid``) is seen deleted only
            when its count goes down.
        StoreError: the store could not be read.
    """
    if supports(store, FollowingStore):
        async with aclosing(store.follow(session_id, since=since)) as followed:
            async for event in followed:
                yield event
        return
    reads = Followed(store, session_id, since)
    while True:
        events = await reads.read()
        for event in events:
            yield event
        if not events:
            await anyio.sleep(interval)
