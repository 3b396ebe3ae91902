"""An openai-agents ``Session`` kept in nous_session.

``NousSession`` implements the openai-agents SDK's ``Session`` protocol (``get_items``,
``add_items``, ``pop_item``, ``clear_session``, ``session_settings``) over a nous_session
session, so that ``Runner.run(agent, input, session=NousSession("chat-42", "sqlite:///a.db"))``
keeps its history in the append-only log::

    from agents import Agent, Runner
    from nous_session.integrations.openai_agents import NousSession

    session = NousSession("chat-42", "sqlite:///chat.sqlite3")
    result = await Runner.run(Agent(name="Assistant"), "Hi!", session=session)
    session.close()

How items are kept: each item the SDK adds (a Responses API input item) is stored once, as
one surface event: the message :func:`nous_session.formats.from_provider` reads from it when
writing that message back gives exactly the item, or else the item verbatim in a
:class:`~nous_session.parts.ProviderPart`. So the session's surface is the conversation in
nous_session's neutral form (other providers' formats, subscribers, the CLI see it), and
``get_items`` gives back exactly what was added. ``pop_item`` and ``clear_session`` are
surface operations (a conditional remove, or a replace of a message that stood for several
items): the items stay in the log, where ``rewind`` can bring them back, and another writer's
change in between makes the pop look again instead of removing the wrong item. What the
surface holds that the SDK did not add (a nous_session compaction's summary, a message an
application added) is given to the SDK as the items it writes as.

Sessions live on a :class:`~nous_session.registry.SessionsPortal` (an event loop in a thread
of its own), because the SDK builds sessions synchronously and runs ``Runner.run_sync`` on a
fresh loop each time: every ``NousSession`` of one store URL shares one portal (and so one
store, whose SQLite writer group-commits across them), closed when the last of them closes or
at exit. Pass ``sessions=`` to use a portal of your own, or a
:class:`~nous_session.registry.Sessions` registry on the event loop the session is used from,
which saves the thread hop of every call.

Needs the ``openai-agents`` extra: ``pip install 'nous_session[openai-agents]'``.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Final, TypeVar

import anyio
import anyio.lowlevel
import attrs

from nous_session._json import dumps, loads
from nous_session.errors import ConflictError, FormatError, InvalidEventError, SessionClosedError
from nous_session.event import message_event
from nous_session.formats import from_provider, to_provider
from nous_session.message import Message, Role
from nous_session.parts import ProviderPart
from nous_session.registry import Sessions, SessionsPortal
from nous_session.stores.base import Store

try:
    from agents.memory.session import _CompactionSnapshot
    from agents.memory.session_settings import (
        SessionSettings,
        coerce_session_settings,
        resolve_session_limit,
    )
    from agents.memory.sqlite_session import SQLiteSession
except ImportError as error:  # pragma: no cover - exercised only without the extra
    raise ImportError(
        "nous_session.integrations.openai_agents needs the openai-agents SDK: "
        "pip install 'nous_session[openai-agents]'"
    ) from error

if TYPE_CHECKING:
    from agents.items import TResponseInputItem

    from nous_session.actor import SessionActor
    from nous_session.log import Log

__all__ = ["ItemError", "NousSession", "item_message", "message_items"]

T = TypeVar("T")

PROVIDER: Final = "openai-responses"
# A pop that keeps losing to other writers gives up after this many looks.
_POP_ATTEMPTS: Final = 32


class ItemError(InvalidEventError, TypeError):
    """An item is not a JSON object (a Responses input item).

    A :class:`TypeError` too, as the SDK's own sessions raise for an item they cannot
    serialise, so code written against them catches it; nothing was added.
    """


def item_message(item: Any) -> Message:
    """The message that stands for one Responses input item, losslessly.

    It is the message the ``"openai-responses"`` format reads from ``item`` when writing that
    message back gives ``item`` exactly; otherwise (an item the format reads as part of a
    larger message, or cannot read) an assistant message holding ``item`` verbatim in a
    :class:`~nous_session.parts.ProviderPart`, which writes back as ``item``.

    Raises:
        ItemError: ``item`` is not a JSON object.
    """
    if not isinstance(item, dict):
        raise ItemError(f"an item must be a dict (a Responses input item), got {item!r}")
    try:
        read = from_provider([item], PROVIDER)
        if len(read) == 1 and to_provider(read, PROVIDER) == [item]:
            return read[0]
    except (FormatError, ValueError, TypeError):
        pass  # not something the format reads: kept verbatim below
    try:
        return Message(Role.ASSISTANT, (ProviderPart(PROVIDER, item),))
    except (ValueError, TypeError) as error:
        raise ItemError(f"an item is not JSON: {error}") from None


def message_items(message: Message) -> list[dict[str, Any]]:
    """The Responses input items a surface message is given to the SDK as (one for a message
    that :func:`item_message` made)."""
    return to_provider([message], PROVIDER)  # type: ignore[return-value]


class NousSession:
    """An openai-agents ``Session`` whose history is a nous_session session.

    Usable from any event loop and thread (see the module's docstring). Every method's
    outcome follows nous_session's rules: a method that returns has committed; one that raises
    :class:`~nous_session.errors.StoreError` committed nothing; a caller cancelled while its
    call runs does not cancel it: the call completes on the portal's loop.
    """

    session_settings: SessionSettings | None

    def __init__(
        self,
        session_id: str,
        store: Store | str | None = None,
        *,
        sessions: SessionsPortal | Sessions | None = None,
        session_settings: SessionSettings | dict[str, Any] | None = None,
    ) -> None:
        """Name the session; nothing is read or written before the first call.

        Args:
            session_id: the session's id (nous_session's rules: a non-empty string).
            store: where it lives: a store URL (``"sqlite:///chat.sqlite3"``,
                ``"postgresql://..."``), a Store (used from the portal's loop only from now
                on), or None for a private in-memory store that ends with this session.
            sessions: a portal of your own to run on, or a :class:`Sessions` registry
                running on the event loop the session will be used from (no thread hop per
                call; calls from another loop then fail); leave ``store`` out.
            session_settings: the SDK's settings (``limit`` for ``get_items``).

        Raises:
            ValueError: a bad argument.
        """
        if not isinstance(session_id, str) or not session_id:
            raise ValueError(f"session_id must be a non-empty string, got {session_id!r}")
        if sessions is not None and store is not None:
            raise ValueError("give store or sessions, not both")
        if sessions is not None and not isinstance(sessions, SessionsPortal | Sessions):
            raise ValueError(f"sessions must be a SessionsPortal or Sessions, got {sessions!r}")
        self.session_id = session_id
        self.session_settings = (
            coerce_session_settings(session_settings)
            if session_settings is not None
            else SessionSettings()
        )
        self._closed = False
        self._shared: _SharedPortal | None = None
        if sessions is None:
            self._shared = _SharedPortal.acquire(store)
            sessions = self._shared.portal
        self._sessions: SessionsPortal | Sessions = sessions
        # Each surface message's items, serialised, by (event seq, index among the messages
        # with that seq): events never change, so an entry never goes stale.
        self._items: dict[tuple[int, int], bytes] = {}

    # The Session protocol ---------------------------------------------------------------------

    async def get_items(self, limit: int | None = None) -> list[TResponseInputItem]:
        """The conversation as the SDK's input items: the latest ``limit`` of them in order
        (``limit`` None: the settings' limit; no limit: all; 0: none).

        Reads what the store holds now, other writers' commits included.

        Raises:
            StoreError: the store could not be read.
            SessionClosedError: this session was closed.
        """
        limit = resolve_session_limit(limit, self.session_settings)
        if limit == 0:
            self._check_open()
            return []
        if limit is not None and limit < 0:
            limit = None

        async def read(actor: SessionActor) -> bytes:
            log = await actor.reload()
            return self._serialised(log, limit)

        # Exact for ints wider than 64 bits, which the SDK's own sessions keep.
        return loads(await self._call(read))  # type: ignore[no-any-return]

    async def add_items(self, items: list[TResponseInputItem]) -> None:
        """Append the items, all or none, each as one surface event.

        Raises:
            ItemError: an item is not a JSON object (nothing was added); a TypeError, as
                the SDK's sessions raise.
            StoreError: the store failed (nothing was added).
            SessionClosedError: this session was closed.
        """
        self._check_open()
        batch = []
        for index, item in enumerate(items):
            try:
                message = item_message(item)
            except InvalidEventError as error:
                raise ItemError(f"item {index}: {error}") from None
            batch.append((*message_event(message), message.created_at))
        if not batch:
            return

        async def add(actor: SessionActor) -> None:
            await actor.append_many(batch)

        await self._mutate(add)

    # The SDK's EncryptedSession authenticates the item it pops before the pop commits (a
    # wrong key then raises InvalidToken and removes nothing) only for a SQLiteSession whose
    # pop_item is SQLiteSession's own; every other session is popped blindly, so a wrong key
    # emptied the history. NousSession is registered as a SQLiteSession (below the class) and
    # takes that very pop_item, which pops through _pop_item_with_validation.
    pop_item = SQLiteSession.pop_item

    async def _pop_item_with_validation(
        self, validate: Callable[[TResponseInputItem], None] | None = None
    ) -> TResponseInputItem | None:
        """What ``pop_item`` does: take the latest item off the surface and return it (None
        when there is none), after ``validate(item)``, if given, accepts it (the SDK's
        protocol with SQLiteSession; see :meth:`pop_item_if`).

        Atomic across writers: the removal is conditional on the surface's last entry being
        the one read, and looks again if another writer changed it first. The item stays in
        the log.

        Raises:
            Exception: whatever ``validate`` raised (nothing was removed).
            StoreError: the store failed (nothing was removed).
            SessionClosedError: this session was closed.
        """
        return await self.pop_item_if(validate)

    async def pop_item_if(
        self, check: Callable[[TResponseInputItem], None] | None
    ) -> TResponseInputItem | None:
        """:meth:`pop_item`, with ``check(item)`` called on the latest item before it is
        removed: if ``check`` raises, nothing is removed and its exception is raised here.

        ``check`` runs in a worker thread (as SQLiteSession runs it in its own), so a slow
        one (a decryption) holds up no event loop; a cancelled caller still waits for it.

        Raises:
            Exception: whatever ``check`` raised (nothing was removed).
            StoreError, SessionClosedError: as :meth:`pop_item`.
        """

        async def pop(actor: SessionActor) -> Any:
            log = await actor.reload()
            for _ in range(_POP_ATTEMPTS):
                entries = log.surface()
                if not entries:
                    return None
                position = entries[-1].position
                tail = _tail(log)  # the messages of the last entry, (seq, message) each
                items = [item for _, message in tail for item in message_items(message)]
                if not items:  # a message that writes as no item: drop it and look again
                    await _conditionally(actor.remove(position, position, expect=[tail[0][0]]))
                    log = actor.log
                    continue
                item = items[-1]
                if check is not None:
                    await anyio.to_thread.run_sync(check, item)  # type: ignore[arg-type]
                rest = [item_message(kept) for kept in items[:-1]]
                edit = (
                    actor.replace(position, position, rest, expect=[tail[0][0]])
                    if rest
                    else actor.remove(position, position, expect=[tail[0][0]])
                )
                if await _conditionally(edit):
                    return item
                log = await actor.reload()
            raise ConflictError(
                f"pop_item lost to other writers {_POP_ATTEMPTS} times in a row; "
                "nothing was removed"
            )

        return await self._mutate(pop)  # type: ignore[no-any-return]

    async def clear_session(self) -> None:
        """Take every item off the surface, in one event (they stay in the log).

        Items another writer adds after the clear stay.

        Raises:
            StoreError: the store failed (nothing was removed).
            SessionClosedError: this session was closed.
        """

        async def clear(actor: SessionActor) -> None:
            log = await actor.reload()
            entries = log.surface()
            if entries:
                await actor.remove(entries[0].position, entries[-1].position)

        await self._mutate(clear)

    async def _get_compaction_snapshot(
        self, limit: int, *, prune_prefix: Callable[[Any], bool] | None = None
    ) -> _CompactionSnapshot:
        """The SDK's hook for its Responses compaction (``OpenAIResponsesCompactionSession``):
        the latest ``limit`` items, whether they are all there is, and an atomic replacement
        of a suffix of them by the compacted output.

        The replacement is one ``replace`` surface event, conditional on the entries read
        still being there (it returns False, replacing nothing, when another writer changed
        them): the compacted items stay in the log, where ``uncompact`` brings them back.
        ``prune_prefix`` then takes the oldest surface items it accepts off the surface.
        """

        async def read(actor: SessionActor) -> Log:
            return await actor.reload()

        log: Log = await self._call(read)
        entries = _entries(log)
        picked: list[_SurfaceEntry] = []
        count = 0
        for entry in reversed(entries):
            if count >= limit:
                break
            picked.append(entry)
            count += len(entry.items)
        picked.reverse()
        every = [item for entry in picked for item in entry.items]
        extra = max(0, len(every) - limit)  # the oldest entry may hold more than was asked

        async def replace_suffix(start: int, output: list[Any]) -> bool:
            index, offset = _locate(picked, start + extra)
            expected = picked[index:]
            if not expected:
                return False
            head = list(expected[0].items[:offset])  # its items before `start` stay
            messages = [item_message(item) for item in [*head, *output]]

            async def edit(actor: SessionActor) -> bool:
                current = _entries(await actor.reload())
                if not current or current[-1].seq != expected[-1].seq:
                    return False  # the suffix read is no longer the newest
                seqs = [entry.seq for entry in expected]
                first, last = expected[0].position, expected[-1].position
                if not await _conditionally(actor.replace(first, last, messages, expect=seqs)):
                    return False
                if prune_prefix is not None:
                    await _prune(actor, prune_prefix, before=first)
                return True

            return await self._mutate(edit)  # type: ignore[no-any-return]

        return _CompactionSnapshot(
            items=every[extra:],  # type: ignore[arg-type]
            complete=len(picked) == len(entries),
            replace_suffix=replace_suffix,
        )

    # Closing ----------------------------------------------------------------------------------

    def close(self) -> None:
        """Stop using the session; later calls raise
        :class:`~nous_session.errors.SessionClosedError`. The shared portal closes with the
        last session using it. Idempotent; what was committed stays."""
        if self._closed:
            return
        self._closed = True
        if self._shared is not None:
            self._shared.release()

    @property
    def closed(self) -> bool:
        """True once :meth:`close` was called."""
        return self._closed

    @property
    def sessions(self) -> SessionsPortal | Sessions:
        """The portal or registry the session's actor runs in (to reach it directly)."""
        return self._sessions

    def __repr__(self) -> str:
        state = "closed" if self._closed else "open"
        return f"<{type(self).__name__} {self.session_id!r} {state}>"

    # Helpers ----------------------------------------------------------------------------------

    def _check_open(self) -> None:
        if self._closed:
            name = type(self).__name__
            raise SessionClosedError(f"{name} is closed (session {self.session_id!r})")

    async def _call(self, fn: Callable[[SessionActor], Any]) -> Any:
        self._check_open()
        sessions = self._sessions
        if isinstance(sessions, Sessions):
            async with sessions.use(self.session_id) as actor:
                return await fn(actor)
        return await sessions.acall(self.session_id, fn)

    async def _mutate(self, fn: Callable[[SessionActor], Any]) -> Any:
        """Run a write and wait for its outcome even if the caller is cancelled meanwhile;
        the cancellation is raised once the outcome is known (as the SDK's own sessions do),
        so a cancelled caller never leaves a write half-known."""
        self._check_open()
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            loop = None
        if loop is None:  # trio: a shielded scope does the same
            with anyio.CancelScope(shield=True):
                result = await self._call(fn)
            await anyio.lowlevel.checkpoint_if_cancelled()
            return result
        sessions = self._sessions
        waiting: asyncio.Future[Any]
        if isinstance(sessions, Sessions) or sessions.is_own_thread():
            # On this loop: its own task, so that cancelling the caller does not cancel it;
            # the caller waits for it below whatever happens, so it never outlives the call.
            waiting = asyncio.ensure_future(self._call(fn))
        else:
            waiting = asyncio.wrap_future(sessions.start(self.session_id, fn), loop=loop)
        cancelled: asyncio.CancelledError | None = None
        while not waiting.done():
            try:
                await asyncio.wait({waiting})
            except asyncio.CancelledError as error:
                cancelled = cancelled or error
        if cancelled is not None:
            raise cancelled
        return waiting.result()

    def _serialised(self, log: Log, limit: int | None) -> bytes:
        """The latest ``limit`` items (all for None) as one JSON array, from the cache where
        the surface's messages were given as items before."""
        pairs = log.derive_indexed()
        chunks: list[bytes] = []
        count = 0
        index = len(pairs) - 1
        while index >= 0 and (limit is None or count < limit):
            seq, message = pairs[index]
            ordinal = 0  # this message's index among the surface messages of its seq
            while index - ordinal - 1 >= 0 and pairs[index - ordinal - 1][0] == seq:
                ordinal += 1
            key = (seq, ordinal)
            chunk = self._items.get(key)
            if chunk is None:
                items = message_items(message)
                chunk = self._items[key] = b"".join(dumps(i) + b"\n" for i in items)
            lines = chunk.splitlines()
            if limit is not None and count + len(lines) > limit:
                lines = lines[len(lines) - (limit - count) :]
            chunks.extend(reversed(lines))
            count += len(lines)
            index -= 1
        if len(self._items) > 2 * len(pairs) + 64:
            self._items.clear()  # what the surface no longer shows goes; the rest comes back
        return b"[" + b",".join(reversed(chunks)) + b"]"


# EncryptedSession tells a session it can authenticate pops with by this isinstance check (see
# pop_item above): registering adds NousSession to SQLiteSession's ABC registry only, so no
# SQLite code is inherited.
SQLiteSession.register(NousSession)


@attrs.frozen
class _SurfaceEntry:
    """One surface entry (a multi-message replace's messages are one) and its items."""

    position: int
    seq: int
    items: tuple[dict[str, Any], ...]


def _entries(log: Log) -> list[_SurfaceEntry]:
    """The surface entries, in order, each with the items its messages write as."""
    out: list[_SurfaceEntry] = []
    for event, (seq, message) in zip(log.surface(), log.derive_indexed(), strict=True):
        items = tuple(message_items(message))
        if out and out[-1].seq == seq:
            last = out[-1]
            out[-1] = _SurfaceEntry(last.position, seq, last.items + items)
        else:
            out.append(_SurfaceEntry(event.position, seq, items))
    return out


def _locate(entries: list[_SurfaceEntry], index: int) -> tuple[int, int]:
    """The entry holding item ``index`` of the entries' items, and the item's place in it."""
    for number, entry in enumerate(entries):
        if index < len(entry.items):
            return number, index
        index -= len(entry.items)
    return len(entries), 0


async def _prune(actor: SessionActor, accept: Callable[[Any], bool], *, before: int) -> None:
    """Take the oldest surface entries off while ``accept`` takes all their items, up to
    position ``before``; conditional, and skipped if another writer got there first."""
    pruned: list[_SurfaceEntry] = []
    for entry in _entries(actor.log):
        if entry.position >= before or not all(accept(item) for item in entry.items):
            break
        pruned.append(entry)
    if pruned:
        seqs = [entry.seq for entry in pruned]
        await _conditionally(actor.remove(pruned[0].position, pruned[-1].position, expect=seqs))


def _tail(log: Log) -> list[tuple[int, Message]]:
    """The surface messages of the last surface entry (several for a multi-message replace)."""
    pairs = log.derive_indexed()
    seq = pairs[-1][0]
    start = len(pairs) - 1
    while start > 0 and pairs[start - 1][0] == seq:
        start -= 1
    return list(pairs[start:])


async def _conditionally(edit: Any) -> bool:
    """Await a conditional surface edit: False when the surface changed under it."""
    try:
        await edit
    except ConflictError:
        return False
    return True


class _SharedPortal:
    """A portal shared by every NousSession of one store URL (or Store object), closed with
    the last of them."""

    _lock: Final = threading.Lock()
    _by_key: Final[dict[object, _SharedPortal]] = {}

    def __init__(self, key: object, portal: SessionsPortal) -> None:
        self.key = key
        self.portal = portal
        self.users = 0

    @classmethod
    def acquire(cls, store: Store | str | None) -> _SharedPortal:
        if store is None:  # private: like an in-memory SQLite database, this session's own
            shared = cls(object(), SessionsPortal("memory:", on_conflict="rebase"))
            shared.users = 1
            return shared
        key: object = store if isinstance(store, str) else id(store)
        with cls._lock:
            found = cls._by_key.get(key)
            if found is None or found.portal.closed:
                found = cls._by_key[key] = cls(key, SessionsPortal(store, on_conflict="rebase"))
            found.users += 1
            return found

    def release(self) -> None:
        with self._lock:
            self.users -= 1
            if self.users > 0:
                return
            if self._by_key.get(self.key) is self:
                del self._by_key[self.key]
        self.portal.close()
