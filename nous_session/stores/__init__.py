"""Stores: where a session's log is persisted.

``Store`` is the contract (see :mod:`nous_session.stores.base`); ``MemoryStore`` is the
in-process reference implementation and the SessionActor's default.
"""

from nous_session.stores.base import Store
from nous_session.stores.memory import MemoryStore

__all__ = ["MemoryStore", "Store"]
