"""What the parts of :class:`~nous_session.stores.sqlite.SQLiteStore` (its erasure, its key
deletes and rewrap, its leases) use of the store itself, declared once."""

from __future__ import annotations

import sqlite3
from collections.abc import Callable
from typing import TypeVar

from nous_session.stores._sealed import Keyring

__all__ = ["StoreFile"]

T = TypeVar("T")


class StoreFile:
    """The store's file and how its parts reach it: the store defines each of these (its
    class comes first in the order its methods are looked up in)."""

    path: str
    read_only: bool
    _keyring: Keyring | None

    @property
    def url(self) -> str:
        raise NotImplementedError

    async def _run(self, function: Callable[[sqlite3.Connection], T]) -> T:
        raise NotImplementedError

    async def _write(self, function: Callable[[sqlite3.Connection], T], what: str) -> T:
        raise NotImplementedError

    def _check_file(self) -> None:
        raise NotImplementedError
