"""The exceptions nous_session raises.

Every exception has one root, so ``except NousSessionError`` catches anything the library
raises on purpose::

    NousSessionError
    ├── InvalidEventError (also a ValueError)  an event, message or request was refused;
    │                                          the log or session is exactly as it was
    ├── FormatError (also a ValueError)        a provider payload is malformed, or the
    │   │                                      provider is unknown (nous_session.formats)
    │   ├── LossyConversionError               a strict conversion would drop something
    │   └── InvalidHistoryError                a strict conversion's history is one the
    │                                          provider's API would reject
    ├── SessionClosedError (also a             the session no longer takes requests
    │   RuntimeError)
    ├── WrongEventLoopError (also a            a call came from another event loop or
    │   RuntimeError)                          thread than the session's; nothing was queued
    ├── OutcomeUnknownError                    a commit may or may not have landed (the
    │                                          store could not be asked); retry with the
    │                                          same idempotency key to find out safely
    └── StoreError                             the store could not do what was asked;
        │                                      nothing of the failed call was stored
        ├── ConflictError                      another writer already holds that seq, the
        │                                      surface changed, or the key is taken
        └── CorruptRecordError                 a stored record cannot be decoded
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from nous_session.formats._validation import HistoryProblem

__all__ = [
    "ConflictError",
    "CorruptRecordError",
    "FormatError",
    "InvalidEventError",
    "InvalidHistoryError",
    "LossyConversionError",
    "NousSessionError",
    "OutcomeUnknownError",
    "SessionClosedError",
    "SessionDeletedError",
    "StoreError",
    "WrongEventLoopError",
]


class NousSessionError(Exception):
    """The root of every exception nous_session raises on purpose."""


class InvalidEventError(NousSessionError, ValueError):
    """An event (or the message or request it came from) is not valid.

    The message names what was wrong and where, for example
    ``event 7 (user_message): data["metadata"]["tags"][1]: bytes is not JSON``.
    Whatever raised it left the log or session unchanged.
    """


class FormatError(NousSessionError, ValueError):
    """A provider payload is malformed, or a conversion names an unknown provider.

    The message names the provider and where the problem is, for example
    ``anthropic payload: messages[2]["content"][0]: a tool_use block needs a string "id"``.
    """


class LossyConversionError(FormatError):
    """A strict conversion (``to_provider(..., strict=True)``) would have dropped something.

    Attributes:
        dropped: the notes saying what could not be carried, one per item.
    """

    def __init__(self, provider: str, dropped: tuple[str, ...]) -> None:
        lines = "".join(f"\n  {note}" for note in dropped)
        super().__init__(f"converting to {provider} would lose {len(dropped)} item(s):{lines}")
        self.provider = provider
        self.dropped = dropped


class InvalidHistoryError(FormatError):
    """A strict conversion (``to_provider(..., strict=True)``) was given a history the
    provider's API would reject (see :func:`nous_session.formats.validate`).

    Attributes:
        provider: the provider.
        problems: what it would reject, one :class:`~nous_session.formats.HistoryProblem` per
            thing, each naming the message by its index.
    """

    def __init__(self, provider: str, problems: Sequence[HistoryProblem]) -> None:
        lines = "".join(f"\n  {problem}" for problem in problems)
        super().__init__(
            f"{provider} would reject this history ({len(problems)} problem(s)):{lines}"
        )
        self.provider = provider
        self.problems = tuple(problems)


class SessionClosedError(NousSessionError, RuntimeError):
    """The session is closed (or closing) and takes no new requests.

    Also a :class:`RuntimeError`, as using any other closed resource is in Python.
    """


class WrongEventLoopError(NousSessionError, RuntimeError):
    """A call reached a session from another event loop or thread than the one that opened it.

    Nothing was queued: the call had no effect. A session belongs to the event loop of the task
    that opened it; code on another loop or in a plain thread reaches it through
    :class:`~nous_session.registry.SessionsPortal`, or with ``anyio.from_thread.run`` from a
    worker thread the owning loop started.
    """


class OutcomeUnknownError(NousSessionError):
    """A commit may or may not have landed, and the store could not be asked which.

    Not a :class:`StoreError`: a StoreError always means nothing was stored. Retrying the
    call with the same idempotency key (``key=``) is safe: if the first attempt landed, the
    retry returns its events instead of appending again.
    """


class StoreError(NousSessionError):
    """A store failed to load or commit; nothing of the failed commit was applied."""


class ConflictError(StoreError):
    """Another writer committed to the session first; the stored count was not the expected one.

    The commit wrote nothing. Reload the session and retry.
    """


class CorruptRecordError(StoreError):
    """A stored record could not be decoded; the message names the record and why."""


class SessionDeletedError(StoreError):
    """The session was deleted from the store (by another holder: another actor, process or
    a retention run) after this actor read or created it.

    Nothing of the failed call was stored, but in one case its message says: a store that
    names the session's identity in its answer to a commit but cannot be told the one expected
    (see :class:`~nous_session.stores.base.Store`) may put the commit into a session another
    holder made again under the same id, and say so only then; the message names the seqs the
    call's events were stored at in that other session. The actor cannot go on (what it holds
    is a session that no longer is), so it closes itself: later calls raise
    :class:`SessionClosedError`, and a :class:`~nous_session.registry.Sessions` registry opens
    a new actor for the next caller. Opening the session again starts it anew, empty (or as
    whoever made it again left it).
    """
