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

Where the session's actor runs is picked by how each call is made. A call from a loop that an
:class:`asyncio.Runner` runs (``asyncio.run``, ``anyio.run``, ``uvloop.run``, the test
plugins), as ``await Runner.run(...)`` makes it, uses a :class:`~nous_session.registry.Sessions`
registry on that very loop, with no thread hop: one per loop and store, opened on the first
call, shared by every ``NousSession`` of that store called from that loop (so a SQLite store's
writer group-commits across them), and closed when the last of those sessions closes or when
the loop's run ends (``asyncio.run`` cancels the tasks left and waits for them, and the
registry closes its actors and its store on the way out). A call made anywhere else
(``Runner.run_sync``, which runs the thread's default loop by hand and shuts its async
generators down after each run without cancelling its tasks; a loop run with
``run_until_complete``; a trio run) goes to a :class:`~nous_session.registry.SessionsPortal`, an
event loop in a thread of its own shared by every ``NousSession`` of the store and closed with
the last of them (or at exit). Pass ``sessions=`` to choose: a portal of your own, or a
``Sessions`` registry you entered on the loop the session is used from.

Needs the ``openai-agents`` extra: ``pip install 'nous_session[openai-agents]'``.
"""

from __future__ import annotations

import asyncio
import contextlib
import weakref
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, Final, cast

import anyio
import anyio.to_thread
import attrs

from nous_session._json import NotJSONError, check_text, dumps, loads
from nous_session._logging import get_logger
from nous_session.errors import (
    ConflictError,
    FormatError,
    InvalidEventError,
    OutcomeUnknownError,
    StoreError,
)
from nous_session.event import EventType, message_event
from nous_session.formats import from_provider, to_provider
from nous_session.integrations._common import missing_extra
from nous_session.integrations._openai_agents_hosts import CallRouter
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
    raise missing_extra(__name__, "the openai-agents SDK", "openai-agents") from error

if TYPE_CHECKING:
    from agents.items import TResponseInputItem

    from nous_session.actor import SessionActor
    from nous_session.log import Log

__all__ = ["ItemError", "NousSession", "item_event", "item_message", "message_items"]

_logger = get_logger("nous_session.openai_agents")

PROVIDER: Final = "openai-responses"
# A write that keeps losing to other writers gives up after this many tries.
_POP_ATTEMPTS: Final = 32
# One lock per actor for pop_item (made on the actor's loop at its first pop; weakly held, so a
# closed actor takes its lock with it).
_POP_LOCKS: weakref.WeakKeyDictionary[SessionActor, anyio.Lock] = weakref.WeakKeyDictionary()


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


def item_event(item: Any) -> tuple[EventType, dict[str, Any]]:
    """The surface event type and data that stand for one item: exactly
    ``message_event(item_message(item))``, with the items an agent adds most (a text message,
    a function call, its output) built directly instead of through a read and a write-back
    in the ``"openai-responses"`` format (a tenth of the cost).

    Raises:
        ItemError: ``item`` is not a JSON object.
        InvalidEventError: a string in it cannot be stored (a lone surrogate).
    """
    if type(item) is dict:
        size = len(item)
        if size == 2:
            content = item.get("content")
            kind = _TEXT_TYPES.get(item.get("role"))
            if kind is not None and type(content) is str and _storable(content):
                return kind, {"content": content}
        elif size == 3 and item.get("type") == "function_call_output":
            call_id, output = item.get("call_id"), item.get("output")
            if type(call_id) is str and type(output) is str and _storable(call_id, output):
                return EventType.TOOL_RESULT, {"content": output, "tool_call_id": call_id}
        elif 4 <= size <= 6 and item.get("type") == "function_call":
            call = _tool_call(item, size)
            if call is not None:
                return EventType.ASSISTANT_MESSAGE, {"tool_calls": [call]}
    return message_event(item_message(item))


# The text items whose role names the message's: {"role": ..., "content": "..."} and no more.
_TEXT_TYPES: Final[dict[object, EventType]] = {
    "user": EventType.USER_MESSAGE,
    "assistant": EventType.ASSISTANT_MESSAGE,
    "system": EventType.SYSTEM_MESSAGE,
    "developer": EventType.DEVELOPER_MESSAGE,
}


def _storable(*texts: str) -> bool:
    """Whether every text encodes (no lone surrogate); the long way says why not."""
    try:
        for text in texts:
            check_text(text)
    except NotJSONError:
        return False
    return True


def _tool_call(item: dict[str, Any], size: int) -> dict[str, Any] | None:
    """A function call item's tool call as the event stores it, or None when the item holds
    anything else (the long way then reads it)."""
    call_id, name, arguments = item.get("call_id"), item.get("name"), item.get("arguments")
    if not (type(call_id) is str and type(name) is str and type(arguments) is str):
        return None
    call: dict[str, Any] = {"id": call_id, "name": name, "arguments": arguments}
    texts = [call_id, name, arguments]
    extra = 4  # type, call_id, name, arguments
    for key, field in (("id", "item_id"), ("status", "status")):
        if key in item:
            value = item[key]
            if type(value) is not str:
                return None
            call[field] = value
            texts.append(value)
            extra += 1
    if extra != size or not call_id or not name or not _storable(*texts):
        return None
    return call


def message_items(message: Message) -> list[dict[str, Any]]:
    """The Responses input items a surface message is given to the SDK as (one for a message
    that :func:`item_message` made)."""
    return to_provider([message], PROVIDER)


class NousSession:
    """An openai-agents ``Session`` whose history is a nous_session session.

    Usable from any event loop and thread (see the module's docstring for where its actor
    runs). Every method's outcome follows nous_session's rules: a method that returns has
    committed; one that raises :class:`~nous_session.errors.StoreError` committed nothing; a
    caller cancelled while a write runs does not cancel the write: the cancellation is raised
    once the write's outcome is known.
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
                ``"postgresql://..."``; each event loop the session is called from opens its
                own store from it), a Store (used from the loop each call comes from, so it
                must work there: a PostgreSQL store's pool belongs to the loop it was opened
                on), or None for the store ``NOUS_SESSION_STORE`` names, else a private
                in-memory store that ends with this session.
            sessions: a portal of your own to run on, or a :class:`Sessions` registry
                running on the event loop the session will be used from (calls from another
                loop then fail); leave ``store`` out.
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
        # Where each call runs: the given sessions, or the store's registry or portal.
        self._calls = CallRouter(type(self).__name__, session_id, store, sessions)
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
            self._calls.check_open()
            return []
        if limit is not None and limit < 0:
            limit = None

        async def read(actor: SessionActor) -> bytes:
            log = await actor.reload()
            return self._serialised(log, limit)

        # Exact for ints wider than 64 bits, which the SDK's own sessions keep. (loads gives
        # Any: the JSON array of the items _serialised wrote.)
        items: list[TResponseInputItem] = loads(await self._calls.call(read))
        return items

    async def add_items(self, items: list[TResponseInputItem]) -> None:
        """Append the items, all or none, each as one surface event.

        Raises:
            ItemError: an item is not a JSON object (nothing was added); a TypeError, as
                the SDK's sessions raise.
            StoreError: the store failed (nothing was added).
            SessionClosedError: this session was closed.
        """
        self._calls.check_open()
        batch = []
        for index, item in enumerate(items):
            try:
                batch.append((*item_event(item), None))  # None: the time is now
            except InvalidEventError as error:
                raise ItemError(f"item {index}: {error}") from None
        if not batch:
            return
        sessions = self._calls.pick()
        if (
            isinstance(sessions, Sessions)
            and self.session_id in sessions  # open: use() takes it without an await
            and _on_asyncio()
        ):
            async with sessions.use(self.session_id) as actor:
                if not actor.statistics().queue_depth:
                    # The common case, in the caller's task (a task per call cost a third
                    # of the adapter's time): with the actor open and its queue empty,
                    # append_many queues the request before its first await (the engine
                    # queues only by send_nowait), so a cancellation can only land once it
                    # is queued, and then the request commits whatever happens to the
                    # caller. Waiting for the actor's answer to a later request keeps the
                    # rule of CallRouter.mutate (the outcome is known when the cancellation is
                    # raised).
                    try:
                        await actor.append_many(batch)
                    except asyncio.CancelledError:
                        await _answered(actor)
                        raise
                    except ConflictError:  # another writer first: caught up, try again
                        await self._calls.mutate(_appending(batch), sessions)
                    return

        await self._calls.mutate(_appending(batch), sessions)

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

        async def pop(actor: SessionActor) -> TResponseInputItem | None:
            # Pops of one actor take turns: each removes the tail the previous one left, so
            # concurrent pops in this process never race each other's conditional edit (64
            # at once lost past the 32nd attempt); other processes' writes still can.
            lock = _POP_LOCKS.get(actor)
            if lock is None:
                lock = _POP_LOCKS[actor] = anyio.Lock()
            async with lock:
                return await pop_once(actor)

        async def pop_once(actor: SessionActor) -> TResponseInputItem | None:
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
                # cast: the SDK's item type is a union of TypedDicts, which our Responses
                # payload's items are; checking them at run time would only cost.
                item = cast("TResponseInputItem", items[-1])
                if check is not None:
                    await anyio.to_thread.run_sync(check, item)
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

        return await self._calls.mutate(pop)

    async def clear_session(self) -> None:
        """Take every item off the surface, in one event (they stay in the log).

        Items another writer adds after the clear stay.

        Raises:
            StoreError: the store failed (nothing was removed).
            SessionClosedError: this session was closed.
        """

        async def clear(actor: SessionActor) -> None:
            log = await actor.reload()
            for _ in range(_POP_ATTEMPTS):
                entries = log.surface()
                if not entries:
                    return
                if await _conditionally(actor.remove(entries[0].position, entries[-1].position)):
                    return
                log = actor.log  # another writer first: the actor has caught up
            raise ConflictError(
                f"clear_session lost to other writers {_POP_ATTEMPTS} times in a row; "
                "nothing was removed"
            )

        await self._calls.mutate(clear)

    async def _get_compaction_snapshot(
        self, limit: int, *, prune_prefix: Callable[[Any], bool] | None = None
    ) -> _CompactionSnapshot | None:
        """The SDK's hook for its Responses compaction (``OpenAIResponsesCompactionSession``):
        the latest ``limit`` items, whether they are all there is, and an atomic replacement
        of a suffix of them by the compacted output.

        The replacement is one ``replace`` surface event, conditional on the entries read
        still being there (it returns False, replacing nothing, when another writer changed
        them): the compacted items stay in the log, where ``uncompact`` brings them back.
        ``prune_prefix`` then takes the oldest surface items it accepts off the surface, in a
        commit of its own: if that one fails, the replacement stands and is reported done
        (True), the failure is logged, and the items stay.

        None for a subclass that overrides an item method (``get_items``, ``add_items``,
        ``pop_item``, ``clear_session``, ``pop_item_if``), which the snapshot would bypass:
        the SDK then reads through ``get_items`` and writes with ``clear_session`` and
        ``add_items``, as for subclasses of its own ``SQLiteSession``.
        """
        if not _item_methods_are_ours(type(self)):
            return None

        entries = _entries(await self._calls.call(_reloaded))
        picked = _newest(entries, limit)
        every = [item for entry in picked for item in entry.items]
        extra = max(0, len(every) - limit)  # the oldest entry may hold more than was asked

        async def replace_suffix(start: int, output: list[Any]) -> bool:
            index, offset = _locate(picked, start + extra)
            expected = picked[index:]
            if not expected:
                return False
            head = list(expected[0].items[:offset])  # its items before `start` stay
            messages = [item_message(item) for item in [*head, *output]]

            return await self._calls.mutate(
                lambda actor: _replace_newest(actor, expected, messages, prune_prefix)
            )

        return _CompactionSnapshot(
            items=cast("list[TResponseInputItem]", every[extra:]),  # as item in pop_item_if
            complete=len(picked) == len(entries),
            replace_suffix=replace_suffix,
        )

    # Closing ----------------------------------------------------------------------------------

    def close(self) -> None:
        """Stop using the session; later calls raise
        :class:`~nous_session.errors.SessionClosedError`. A loop's registry, or the shared
        portal, that this session used closes with the last session using it (a registry
        stops on its loop, soon after). Idempotent; what was committed stays; from any
        thread."""
        self._calls.close()

    @property
    def closed(self) -> bool:
        """True once :meth:`close` was called."""
        return self._calls.closed

    @property
    def sessions(self) -> SessionsPortal | Sessions | None:
        """The portal or registry the session's actor runs in (to reach it directly): the one
        given as ``sessions=``; else the registry of the calling asyncio loop, or the portal,
        once a call used it; else None."""
        return self._calls.sessions

    def __repr__(self) -> str:
        state = "closed" if self.closed else "open"
        return f"<{type(self).__name__} {self.session_id!r} {state}>"

    # Helpers ----------------------------------------------------------------------------------

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


# The methods items go in and out by: a subclass that overrides one of them gets no compaction
# snapshot (see NousSession._get_compaction_snapshot).
_ITEM_METHODS: Final = (
    "get_items",
    "add_items",
    "pop_item",
    "_pop_item_with_validation",
    "pop_item_if",
    "clear_session",
)


async def _reloaded(actor: SessionActor) -> Log:
    """The session's log, caught up with the store."""
    return await actor.reload()


def _newest(entries: Sequence[_SurfaceEntry], limit: int) -> list[_SurfaceEntry]:
    """The newest ``entries`` that hold the newest ``limit`` items (the oldest of them may
    hold more), oldest first."""
    picked: list[_SurfaceEntry] = []
    count = 0
    for entry in reversed(entries):
        if count >= limit:
            break
        picked.append(entry)
        count += len(entry.items)
    picked.reverse()
    return picked


def _item_methods_are_ours(cls: type[NousSession]) -> bool:
    """Whether ``cls`` takes every item method from NousSession unchanged."""
    return all(getattr(cls, name) is getattr(NousSession, name) for name in _ITEM_METHODS)


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


async def _replace_newest(
    actor: SessionActor,
    expected: Sequence[_SurfaceEntry],
    messages: list[Message],
    prune_prefix: Callable[[Any], bool] | None,
) -> bool:
    """Replace the surface entries ``expected`` by ``messages`` if they are still the newest
    (False, changing nothing, when another writer changed them), then take the oldest items
    ``prune_prefix`` accepts off the surface. A failed prune leaves the replacement standing
    (True): it is logged, and the items stay."""
    current = _entries(await actor.reload())
    if not current or current[-1].seq != expected[-1].seq:
        return False  # the suffix read is no longer the newest
    seqs = [entry.seq for entry in expected]
    first, last = expected[0].position, expected[-1].position
    if not await _conditionally(actor.replace(first, last, messages, expect=seqs)):
        return False
    if prune_prefix is not None:
        try:
            await _prune(actor, prune_prefix, before=first)
        except (StoreError, OutcomeUnknownError) as error:
            # The replacement committed: a StoreError would say it did not. The prefix stays
            # (EncryptedSession drops expired items as it reads).
            _logger.warning(
                "nous_session.openai_agents_prune_failed",
                session_id=actor.session_id,
                error=str(error),
            )
    return True


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


def _appending(batch: list[Any]) -> Callable[[SessionActor], Any]:
    """A write of ``batch``, tried again while it loses to other writers (a loop's registry
    commits plainly: a ConflictError means nothing was appended and the actor caught up)."""

    async def append(actor: SessionActor) -> None:
        for _ in range(_POP_ATTEMPTS - 1):
            try:
                await actor.append_many(batch)
            except ConflictError:
                continue
            return
        await actor.append_many(batch)

    return append


def _on_asyncio() -> bool:
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return False
    return True


async def _answered(actor: SessionActor) -> None:
    """Return once ``actor`` has answered every request queued before this call: the actor
    answers requests in the order they were queued, so a reload's answer comes after theirs.
    The reload runs in a task of its own, which cancellations of the caller do not reach (an
    anyio cancel scope cancels the caller again at every await: reloads of its own would each
    be cancelled, for ever); they do not cut the wait short (the caller raises its own)."""
    waiting = asyncio.ensure_future(actor.reload())
    while not waiting.done():
        with contextlib.suppress(asyncio.CancelledError):
            await asyncio.wait({waiting})
    if not waiting.cancelled():
        waiting.exception()  # retrieved: its failure is the actor's to report, not this call's
