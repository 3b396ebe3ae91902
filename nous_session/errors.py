"""The exceptions nous_session raises.

Every exception has one root, so ``except NousSessionError`` catches anything the library
raises on purpose::

    NousSessionError
    ├── InvalidEventError (also a ValueError)  an event, message or request was refused;
    │                                          the log or session is exactly as it was
    ├── SessionClosedError                     the session no longer takes requests
    └── StoreError                             the store could not do what was asked
        ├── ConflictError                      another writer already holds that seq
        └── CorruptRecordError                 a stored record cannot be decoded
"""

from __future__ import annotations

__all__ = [
    "ConflictError",
    "CorruptRecordError",
    "InvalidEventError",
    "NousSessionError",
    "SessionClosedError",
    "StoreError",
]


class NousSessionError(Exception):
    """The root of every exception nous_session raises on purpose."""


class InvalidEventError(NousSessionError, ValueError):
    """An event (or the message or request it came from) is not valid.

    The message names what was wrong and where, for example
    ``event 7 (user_message): data["metadata"]["tags"][1]: bytes is not JSON``.
    Whatever raised it left the log or session unchanged.
    """


class SessionClosedError(NousSessionError):
    """The session is closed (or closing) and takes no new requests."""


class StoreError(NousSessionError):
    """A store failed to load or commit; nothing of the failed commit was applied."""


class ConflictError(StoreError):
    """Another writer committed to the session first; the stored count was not the expected one.

    The commit wrote nothing. Reload the session and retry.
    """


class CorruptRecordError(StoreError):
    """A stored record could not be decoded; the message names the record and why."""
