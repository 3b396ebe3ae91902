"""A pydantic-ai ``ConversationStore`` that keeps each conversation in a nous_session session.

:class:`NousConversationStore` implements pydantic-ai's storage interface
(``pydantic_ai.conversation_store.ConversationStore``: ``read_record``, ``read_records``,
``write_record``, ``delete_record``, ``read_entry``, and ``read_history`` in one read), so
pydantic-ai's own ``load``, ``save``, ``branch``, ``fork``, ``list_conversations`` and
``delete`` work over any nous_session store (memory, SQLite, PostgreSQL)::

    async with NousConversationStore.open("sqlite:///sessions.sqlite3") as store:
        conversation = await store.load("chat-42") or Conversation(conversation_id="chat-42")
        result = await agent.run("Hi!", conversation=conversation)
        await store.save(result)

The mapping:

* **One session per conversation**: session id ``session_prefix + conversation_id`` (default
  ``"pydantic-ai:"``). One :class:`~nous_session.SessionActor` per conversation in use; at
  most ``max_open`` stay open, the least recently used idle one closing (and reopening from
  the store when next needed). The actors do not follow other processes' commits by
  themselves (``follow=False``): every read and every write catches up with the store first,
  and the count a write was checked against is the count its commit expects.
* ``x.pydantic_ai.entry``: one message of the conversation's log, stored once, losslessly:
  its entry id, the entry before it, and the message as ``ModelMessagesTypeAdapter`` JSON
  (the text pydantic-ai itself writes and reads back, kept as a string). That JSON does not
  tell a ``BinaryContent`` of an image from a ``BinaryImage`` (pydantic-ai reads both back as
  a ``BinaryImage``), so ``plain_binary`` lists where the message held the former, and a read
  turns those back: a message loads equal to, and of the same classes as, the one saved.
* ``x.pydantic_ai.record``: the conversation's record (head, usage, deferred tool requests,
  scope, fork origin, branches, time) as pydantic-ai serialises it. The latest one counts.
* ``x.pydantic_ai.deleted``: ``delete_record``. The log is append-only: the conversation no
  longer loads or lists, and its entries stay in the log (a fork made before has copies).
* **Revisions are the session's count** right after the commit that wrote the record: a save
  carrying another revision raises ``ConversationConflict`` and commits nothing. The check and
  the commit are atomic: in this process a lock per conversation orders them, and another
  process's commit in between makes the store refuse ours (nous_session's ``ConflictError``),
  after which the check runs again on the caught-up log. ``write_record`` sets the revision on
  the record it is given (pydantic-ai's ``save``, ``branch`` and ``fork`` read it from there).
* **Forks** copy the kept history's entries (same ids, same messages) into the fork's session,
  in the commit that writes its record, so every conversation's history is in its own session.
* **The surface.** The messages of the conversation's current history are also on the
  session's surface as nous_session messages (system and user prompts, assistant text with
  tool calls, tool returns and retries; each with its entry id in
  ``metadata["pydantic_ai_entry"]``), so ``session.messages()``, subscribers and
  ``nous-session messages pydantic-ai:chat-42`` show the conversation. A save that extends the
  history appends its messages in the record's commit; a branch, a fork or a rewritten history
  replaces the surface in one ``replace`` event. Only the entry events are read back: the
  surface is a view, and a message that cannot be shown there is logged and left out of it.

Entry ids are pydantic-ai's own (unique, minted by its ``save``); the store remembers which
conversation holds the entries it read or wrote. ``read_entry`` of an id it has not seen looks
through the store's conversations.

The store is anyio (asyncio or trio; pydantic-ai runs agents on asyncio only) and belongs to
the event loop it was opened in. ``list_conversations`` (``read_records``) reads every
conversation's record.

Needs the ``pydantic-ai`` extra: ``pip install 'nous_session[pydantic-ai]'``.
"""

from __future__ import annotations

import dataclasses
import weakref
from collections import OrderedDict
from collections.abc import AsyncIterator, Iterator, Mapping, Sequence
from contextlib import asynccontextmanager
from datetime import datetime
from typing import Any, Final

import anyio
import anyio.abc

from nous_session._logging import get_logger
from nous_session.actor import SessionActor
from nous_session.errors import ConflictError, InvalidEventError, OutcomeUnknownError, StoreError
from nous_session.event import EventType, message_event
from nous_session.integrations._common import StoreHost, missing_extra, opened_store
from nous_session.integrations._listing import listed_ids
from nous_session.log import Log
from nous_session.message import Message, ToolCall
from nous_session.metadata import SessionMetadata
from nous_session.registry import Sessions
from nous_session.stores.base import Store

try:
    import pydantic
    from pydantic_ai.conversation_store import (
        ConversationConflict,
        ConversationEntry,
        ConversationRecord,
        ConversationStore,
    )
    from pydantic_ai.messages import (
        BinaryContent,
        BinaryImage,
        ModelMessage,
        ModelMessagesTypeAdapter,
        ModelResponse,
        RetryPromptPart,
        SystemPromptPart,
        TextPart,
        ToolCallPart,
        ToolReturnPart,
        UserPromptPart,
    )
except ImportError as error:  # pragma: no cover - exercised only without the extra
    raise missing_extra(__name__, "pydantic-ai", "pydantic-ai") from error

__all__ = [
    "DELETED_EVENT",
    "ENTRY_EVENT",
    "RECORD_EVENT",
    "NousConversationStore",
    "entry_messages",
]

ENTRY_EVENT: Final = "x.pydantic_ai.entry"
RECORD_EVENT: Final = "x.pydantic_ai.record"
DELETED_EVENT: Final = "x.pydantic_ai.deleted"
ENTRY_METADATA: Final = "pydantic_ai_entry"
# An entry's list of where its message holds a plain BinaryContent of an image (see _entry).
PLAIN_BINARY_FIELD: Final = "plain_binary"

# A write that keeps losing to other processes' commits gives up after this many tries.
_ATTEMPTS: Final = 32
# How many entry ids the store remembers the conversation of.
_REMEMBERED: Final = 65_536

_RecordsAdapter: pydantic.TypeAdapter[list[ConversationRecord]] = pydantic.TypeAdapter(
    list[ConversationRecord],
    config=pydantic.ConfigDict(defer_build=True, ser_json_bytes="base64", val_json_bytes="base64"),
)
_OPEN_KEY: Final = object()
_logger = get_logger()


# The projection onto the surface ----------------------------------------------------------------


def entry_messages(message: ModelMessage, entry_id: str | None = None) -> list[Message]:
    """The nous_session messages a pydantic-ai message is shown as on the surface.

    A request gives a system message per system prompt, a user message per user prompt
    (its text; other content as ``[kind]``), a tool message per tool return, and per retry
    prompt a failed tool message (or a user message when it names no tool). A response gives
    one assistant message with its text and tool calls (none when it has neither). Each
    carries ``entry_id`` in ``metadata["pydantic_ai_entry"]``.
    """
    metadata: dict[str, Any] = {} if entry_id is None else {ENTRY_METADATA: entry_id}
    created = message.timestamp if isinstance(message.timestamp, datetime) else None
    out: list[Message] = []
    if isinstance(message, ModelResponse):
        texts = [part.content for part in message.parts if isinstance(part, TextPart)]
        calls = [
            ToolCall(part.tool_call_id, part.tool_name, _arguments(part.args))
            for part in message.parts
            if isinstance(part, ToolCallPart)
        ]
        if texts or calls:
            out.append(
                Message.assistant(
                    "".join(texts) if texts else None,
                    tool_calls=calls,
                    metadata=metadata,
                    created_at=created,
                )
            )
        return out
    for part in message.parts:
        if isinstance(part, SystemPromptPart):
            out.append(Message.system(part.content, metadata=metadata, created_at=created))
        elif isinstance(part, UserPromptPart):
            out.append(Message.user(_prompt_text(part), metadata=metadata, created_at=created))
        elif isinstance(part, RetryPromptPart) and part.tool_name is None:
            out.append(Message.user(part.model_response(), metadata=metadata, created_at=created))
        elif isinstance(part, ToolReturnPart | RetryPromptPart):
            # A retry prompt naming a tool is that tool's failed result.
            out.append(
                Message.tool(
                    part.tool_call_id,
                    (
                        part.model_response()
                        if isinstance(part, RetryPromptPart)
                        else part.model_response_str()
                    ),
                    name=part.tool_name,
                    is_error=isinstance(part, RetryPromptPart),
                    metadata=metadata,
                    created_at=created,
                )
            )
    return out


def _arguments(args: Any) -> Mapping[str, Any] | str:
    if args is None:
        return {}
    if isinstance(args, str | Mapping):
        return args
    return str(args)  # pragma: no cover - pydantic-ai's args are a str, a dict or None


def _prompt_text(part: UserPromptPart) -> str:
    if isinstance(part.content, str):
        return part.content
    return "".join(
        item if isinstance(item, str) else f"[{getattr(item, 'kind', type(item).__name__)}]"
        for item in part.content
    )


def _projection(conversation_id: str, entries: Sequence[ConversationEntry]) -> list[Message]:
    """The surface messages of ``entries``; what cannot be shown is logged and left out."""
    out: list[Message] = []
    for entry in entries:
        try:
            messages = entry_messages(entry.message, entry.id)
            for message in messages:
                message_event(message)  # refuses what no store could hold
        except (ValueError, TypeError) as error:
            _logger.warning(
                "nous_session.pydantic_ai_message_not_projected",
                conversation_id=conversation_id,
                entry_id=entry.id,
                error=repr(error),
            )
            continue
        out.extend(messages)
    return out


def _message_items(messages: Sequence[Message]) -> list[tuple[Any, ...]]:
    return [(*message_event(message), message.created_at) for message in messages]


# Reading a session ------------------------------------------------------------------------------


@dataclasses.dataclass
class _Index:
    """What a conversation's session holds, folded from its events."""

    horizon: int = 0
    count: int = 0
    # entry id -> the entry event's data (id, parent_id, kind, message)
    entries: dict[str, Mapping[str, Any]] = dataclasses.field(default_factory=dict)
    # the latest record event's (seq, data), None when there is none or it was deleted
    record: tuple[int, Mapping[str, Any]] | None = None

    def fold(self, log: Log) -> _Index:
        """This index brought up to ``log`` (a new one when ``log`` is not a continuation)."""
        index = self
        if log.horizon != self.horizon or log.count < self.count:
            index = _Index(horizon=log.horizon)
        for event in log.since(index.count):
            if event.type == ENTRY_EVENT:
                entry_id = event.data.get("id")
                if isinstance(entry_id, str):
                    index.entries.setdefault(entry_id, event.data)
            elif event.type == RECORD_EVENT:
                index.record = (event.seq, event.data)
            elif event.type == DELETED_EVENT:
                index.record = None
        index.count = log.count
        return index

    def revision(self) -> str | None:
        return None if self.record is None else _revision(self.record[0])

    def entry(self, entry_id: str) -> ConversationEntry:
        data = self.entries[entry_id]  # KeyError (a LookupError) when it is not here
        return _entry(data)

    def history(self, head_id: str | None, limit: int | None) -> list[ConversationEntry]:
        out: list[ConversationEntry] = []
        entry_id = head_id
        while entry_id is not None and (limit is None or len(out) < limit):
            data = self.entries[entry_id]
            out.append(_entry(data))
            parent = data.get("parent_id")
            entry_id = parent if isinstance(parent, str) else None
        out.reverse()
        return out

    def chain(self, head_id: str | None) -> list[Mapping[str, Any]]:
        """The entry events' data from the first entry up to ``head_id``."""
        out: list[Mapping[str, Any]] = []
        entry_id = head_id
        while entry_id is not None:
            data = self.entries[entry_id]
            out.append(data)
            parent = data.get("parent_id")
            entry_id = parent if isinstance(parent, str) else None
        out.reverse()
        return out


def _revision(record_seq: int) -> str:
    """A record's revision: the session's count right after the commit that wrote it."""
    return str(record_seq + 1)


def _entry(data: Mapping[str, Any]) -> ConversationEntry:
    parent = data.get("parent_id")
    message = ModelMessagesTypeAdapter.validate_json(str(data["message"]))[0]
    for path in data.get(PLAIN_BINARY_FIELD) or ():
        message = _as_saved(message, path)
    return ConversationEntry(
        id=str(data["id"]),
        parent_id=parent if isinstance(parent, str) else None,
        message=message,
        kind=data.get("kind", "message"),
    )


def _entry_data(entry: ConversationEntry) -> dict[str, Any]:
    text = ModelMessagesTypeAdapter.dump_json([entry.message]).decode()
    data: dict[str, Any] = {
        "id": entry.id,
        "parent_id": entry.parent_id,
        "kind": entry.kind,
        "message": text,
    }
    if '"kind":"binary"' in text:  # only then can the message hold one
        plain = [list(path) for path in _plain_images(entry.message)]
        if plain:
            data[PLAIN_BINARY_FIELD] = plain
    return data


# Where a message holds a value: dataclass field names, list or tuple indexes and dict keys.
_Path = tuple[str | int, ...]


def _plain_images(value: Any, path: _Path = ()) -> Iterator[_Path]:
    """Where ``value`` holds a ``BinaryContent`` (the class itself) of an image: its JSON is
    a ``BinaryImage``'s, which is what pydantic-ai's validation makes of it."""
    if isinstance(value, BinaryContent):
        if type(value) is BinaryContent and value.is_image:
            yield path
    elif isinstance(value, list | tuple):
        for index, item in enumerate(value):
            yield from _plain_images(item, (*path, index))
    elif isinstance(value, dict):
        for key, item in value.items():
            if isinstance(key, str):
                yield from _plain_images(item, (*path, key))
    elif dataclasses.is_dataclass(value) and not isinstance(value, type):
        for field in dataclasses.fields(value):
            yield from _plain_images(getattr(value, field.name), (*path, field.name))


def _as_saved(value: Any, path: Sequence[object]) -> Any:
    """``value`` (just validated from its JSON) with the ``BinaryImage`` at ``path`` turned
    back into the ``BinaryContent`` that was saved; what does not match is left as it is."""
    if not path:
        if type(value) is not BinaryImage:
            return value
        return BinaryContent(
            data=value.data,
            media_type=value.media_type,
            identifier=value.identifier,
            vendor_metadata=value.vendor_metadata,
        )
    step, rest = path[0], path[1:]
    if type(step) is int and isinstance(value, list | tuple) and 0 <= step < len(value):
        item = _as_saved(value[step], rest)
        if isinstance(value, tuple):
            return (*value[:step], item, *value[step + 1 :])
        value[step] = item
    elif isinstance(step, str) and isinstance(value, dict):
        if step in value:
            value[step] = _as_saved(value[step], rest)
    elif (
        isinstance(step, str)
        and dataclasses.is_dataclass(value)
        and not isinstance(value, type)
        and any(field.name == step for field in dataclasses.fields(value))
    ):
        # The validation above just made this object: ours to change, frozen or not.
        object.__setattr__(value, step, _as_saved(getattr(value, step), rest))
    return value


def _record(seq: int, data: Mapping[str, Any]) -> ConversationRecord:
    record = _RecordsAdapter.validate_json(str(data["record"]))[0]
    record.revision = _revision(seq)
    return record


# The store --------------------------------------------------------------------------------------


class NousConversationStore(StoreHost, ConversationStore):
    """A pydantic-ai ``ConversationStore`` over a nous_session store; see the module's docstring.

    Open it with :meth:`open` (an ``async with`` block): it runs one actor per conversation in
    use and closes them (and a store it opened from a URL) when the block ends.
    """

    def __init__(
        self,
        key: object,
        *,
        store: Store,
        sessions: Sessions,
        session_prefix: str,
        max_open: int,
    ) -> None:
        if key is not _OPEN_KEY:
            raise TypeError("use `async with NousConversationStore.open(store) as store`")
        self._store = store
        # The open conversations' actors, at most max_open (least recently used close first).
        self._sessions = sessions
        self._prefix = session_prefix
        self._max_open = max_open
        self._closed = False
        self._indexes: dict[str, _Index] = {}
        self._locks: weakref.WeakValueDictionary[str, anyio.Lock] = weakref.WeakValueDictionary()
        # entry id -> the id of a conversation whose session holds it, least recently used first
        self._where: OrderedDict[str, str] = OrderedDict()

    @classmethod
    @asynccontextmanager
    async def open(
        cls,
        store: Store | str | None = None,
        *,
        session_prefix: str = "pydantic-ai:",
        max_open: int = 256,
    ) -> AsyncIterator[NousConversationStore]:
        """Run a conversation store for the duration of the ``async with`` block.

        Args:
            store: a nous_session Store, or a URL for :func:`~nous_session.open_store` (then
                closed with the block); None: the store ``NOUS_SESSION_STORE`` names, else a
                private in-memory store.
            session_prefix: put before a conversation id to make its session id (a session id
                is at most 256 UTF-8 bytes).
            max_open: how many conversations keep their session open (its actor and its log in
                memory) between calls; beyond it the least recently used idle one is closed,
                and opened again from the store when next used.

        Raises:
            ValueError: a bad argument.
        """
        if not isinstance(session_prefix, str):
            raise ValueError(f"session_prefix must be a str, got {session_prefix!r}")
        if type(max_open) is not int or max_open < 1:
            raise ValueError(f"max_open must be an int >= 1, got {max_open!r}")
        # follow=False: an actor's count moves only with our commits and reloads, so a
        # write's check and its commit see the same count (another process's commit in
        # between is the store's ConflictError, never a silent catch-up).
        async with (
            opened_store(store) as resolved,
            Sessions(resolved, follow=False, max_open=max_open) as sessions,
        ):
            conversations = cls(
                _OPEN_KEY,
                store=resolved,
                sessions=sessions,
                session_prefix=session_prefix,
                max_open=max_open,
            )
            try:
                yield conversations
            finally:
                conversations._closed = True

    def session_id(self, conversation_id: str) -> str:
        """The id of the session that holds ``conversation_id``."""
        return f"{self._prefix}{conversation_id}"

    @asynccontextmanager
    async def session(self, conversation_id: str) -> AsyncIterator[SessionActor]:
        """The open session of ``conversation_id`` for the block: to read its surface, follow
        its events (``subscribe``) or append events of your own.

        The store's own actor for the conversation, not closed for want of room while the
        block runs. It does not follow other processes' commits by itself: ``reload()`` first
        where they matter.
        """
        async with self._use(self.session_id(conversation_id)) as actor:
            yield actor

    # The actors -------------------------------------------------------------------------------

    @asynccontextmanager
    async def _use(self, session_id: str) -> AsyncIterator[SessionActor]:
        """The session's actor, opened on first use, kept open while the block runs."""
        if self._closed:
            raise RuntimeError("the NousConversationStore is closed")
        async with self._sessions.use(session_id) as actor:
            yield actor

    # The storage primitives -------------------------------------------------------------------

    async def read_record(self, conversation_id: str) -> ConversationRecord | None:
        """The conversation's record (what the store holds now, other writers' commits
        included), or None if the store does not have it."""
        index = await self._index_of(self.session_id(conversation_id))
        if index.record is None:
            return None
        record = _record(*index.record)
        self._remember(conversation_id, record.head_id, *record.branches)
        return record

    async def read_records(
        self, *, scope: str | None = None, limit: int | None = None
    ) -> Sequence[ConversationRecord]:
        """The stored records (those of ``scope``), newest ``updated_at`` first, at most
        ``limit``.

        Found through the store's listing (:class:`~nous_session.stores.base.ListingStore`:
        each conversation's session has metadata with the scope as its owner), so only the
        conversations of ``scope`` are read; conversations last written by a version that set
        no metadata are found by reading every conversation instead, as before.
        """
        records = []
        for session_id in await self._listed_ids(scope):
            record = await self.read_record(session_id[len(self._prefix) :])
            if record is not None and (scope is None or record.scope == scope):
                records.append(record)
        records.sort(key=lambda record: record.updated_at, reverse=True)
        return records[:limit]

    async def write_record(
        self,
        record: ConversationRecord,
        *,
        new_entries: Sequence[ConversationEntry] = (),
        expected_revision: str | None,
    ) -> None:
        """Store ``record`` with ``new_entries`` in one commit, if the stored revision is
        ``expected_revision`` (None: the store has no record), and set ``record.revision`` to
        the new one (the session's count).

        Raises:
            ConversationConflict: the stored revision is another, or ``record.head_id`` names an
                entry neither the conversation, nor ``new_entries``, nor (for a new fork) the
                conversation it forks holds.
            StoreError: the store failed (nothing was written).
        """
        conversation_id = record.conversation_id
        session_id = self.session_id(conversation_id)
        fresh = {entry.id for entry in new_entries}
        async with self._lock(session_id), self._use(session_id) as actor:
            for _ in range(_ATTEMPTS):
                checked = await actor.reload()
                index = self._fold(session_id, checked)
                if index.revision() != expected_revision:
                    raise ConversationConflict(conversation_id)
                previous = _record(*index.record).head_id if index.record is not None else None
                copies: list[Mapping[str, Any]] = []
                head = record.head_id
                if head is not None and head not in fresh and head not in index.entries:
                    if record.forked_from is None or expected_revision is not None:
                        raise ConversationConflict(conversation_id)
                    copies = await self._chain(record.forked_from, head)
                    if not copies:  # gone from the conversation it forks: released meanwhile
                        raise ConversationConflict(conversation_id)
                kept = [data for data in copies if data["id"] not in index.entries]
                written = [_entry_data(entry) for entry in new_entries]
                items: list[tuple[Any, ...]] = [
                    *((ENTRY_EVENT, data) for data in kept),
                    *((ENTRY_EVENT, data) for data in written),
                ]
                metadata = self._metadata(record.scope)
                if metadata is not None and actor.metadata != metadata:
                    # Whose it is, for read_records (the store's index), in the same commit.
                    items.insert(0, (EventType.METADATA, {"metadata": metadata.to_json()}))
                extends = not copies and (
                    new_entries[0].parent_id == previous if new_entries else head == previous
                )
                if extends:
                    items.extend(_message_items(_projection(conversation_id, new_entries)))
                stored = dataclasses.replace(record, revision="")
                items.append(
                    (RECORD_EVENT, {"record": _RecordsAdapter.dump_json([stored]).decode()})
                )
                try:
                    # Conditional on the log the check read: a commit another process made
                    # since (a plain append would land after it) refuses ours.
                    events = await actor.append_many(items, expect_count=checked.count)
                except ConflictError:
                    continue  # another process committed first: check again
                record.revision = _revision(events[-1].seq)
                self._remember(conversation_id, *fresh, *(str(d["id"]) for d in copies))
                if not extends:
                    history = self._fold(session_id, actor.log).history(head, None)
                    await self._replace_surface(actor, _projection(conversation_id, history))
                return
        raise ConversationConflict(conversation_id)

    async def delete_record(self, conversation_id: str, *, expected_revision: str) -> None:
        """Delete the conversation's record if its revision is ``expected_revision``: one
        ``x.pydantic_ai.deleted`` event, and its messages off the surface. The entries stay
        in the log (nothing in an append-only log is erased).

        Raises:
            ConversationConflict: the store has no record of that revision.
            StoreError: the store failed (nothing was deleted).
        """
        session_id = self.session_id(conversation_id)
        async with self._lock(session_id), self._use(session_id) as actor:
            for _ in range(_ATTEMPTS):
                checked = await actor.reload()
                index = self._fold(session_id, checked)
                if index.record is None or index.revision() != expected_revision:
                    raise ConversationConflict(conversation_id)
                try:
                    await actor.append_many(
                        [(DELETED_EVENT, {"revision": expected_revision})],
                        expect_count=checked.count,
                    )
                except ConflictError:
                    continue
                await self._replace_surface(actor, [])
                return
        raise ConversationConflict(conversation_id)

    async def read_entry(self, entry_id: str) -> ConversationEntry:
        """The entry with this id.

        Raises:
            KeyError: no conversation of the store holds it.
        """
        for conversation_id in await self._holders(entry_id):
            index = await self._index_of(self.session_id(conversation_id))
            if entry_id in index.entries:
                self._remember(conversation_id, entry_id)
                return index.entry(entry_id)
        raise KeyError(entry_id)

    async def read_history(
        self, head_id: str | None, *, limit: int | None = None
    ) -> list[ConversationEntry]:
        """The entries from the first up to ``head_id``, in order (the last ``limit`` of them),
        read from the one conversation that holds them.

        Raises:
            KeyError: no conversation of the store holds ``head_id``.
        """
        if head_id is None:
            return []
        for conversation_id in await self._holders(head_id):
            index = await self._index_of(self.session_id(conversation_id))
            if head_id in index.entries:
                self._remember(conversation_id, head_id)
                return index.history(head_id, limit)
        raise KeyError(head_id)

    # Helpers ----------------------------------------------------------------------------------

    def _lock(self, session_id: str) -> anyio.Lock:
        lock = self._locks.get(session_id)
        if lock is None:
            lock = self._locks[session_id] = anyio.Lock()
        return lock

    def _fold(self, session_id: str, log: Log) -> _Index:
        index = self._indexes.get(session_id, _Index()).fold(log)
        self._indexes[session_id] = index
        return index

    async def _index_of(self, session_id: str) -> _Index:
        """The session's index, caught up with the store."""
        async with self._use(session_id) as actor:
            log = await actor.reload()
            index = self._fold(session_id, log)
        if len(self._indexes) > 4 * self._max_open:
            self._indexes = {session_id: index}  # a bound on memory; indexes are rebuilt on use
        return index

    async def _chain(self, conversation_id: str, head_id: str) -> list[Mapping[str, Any]]:
        """The entry events' data of ``conversation_id``'s history up to ``head_id`` (its
        current history or a branch it left), for a fork to copy; empty when it has none."""
        index = await self._index_of(self.session_id(conversation_id))
        try:
            return index.chain(head_id)
        except KeyError:
            return []

    def _remember(self, conversation_id: str, *entry_ids: str | None) -> None:
        for entry_id in entry_ids:
            if entry_id is None:
                continue
            self._where[entry_id] = conversation_id
            self._where.move_to_end(entry_id)
        while len(self._where) > _REMEMBERED:
            self._where.popitem(last=False)

    async def _holders(self, entry_id: str) -> list[str]:
        """The conversations to look for ``entry_id`` in: the one remembered, else all."""
        known = self._where.get(entry_id)
        if known is not None:
            return [known]
        return [session_id[len(self._prefix) :] for session_id in await self._session_ids()]

    def _metadata(self, scope: str | None) -> SessionMetadata | None:
        """The metadata of a conversation's session: its scope as owner, and this store's
        prefix (``extra.pydantic_ai``); None for a scope metadata cannot hold (empty)."""
        try:
            return SessionMetadata(
                owner=scope, app="pydantic-ai", extra={"pydantic_ai": self._prefix}
            )
        except ValueError:
            return None

    async def _listed_ids(self, scope: str | None) -> list[str]:
        """The session ids of the conversations of ``scope`` (all for None), through the
        store's listing when it has one."""
        where: dict[str, Any] = {"app": "pydantic-ai", "pydantic_ai": self._prefix}
        if scope is not None:
            where["owner"] = scope
        listed = None if self._metadata(scope) is None else where
        found = await listed_ids(self._store, listed, self._prefix)
        return await self._session_ids() if found is None else found

    async def _session_ids(self) -> list[str]:
        return sorted(
            info.session_id
            for info in await self._store.sessions()
            if info.session_id.startswith(self._prefix)
        )

    async def _replace_surface(self, actor: SessionActor, messages: list[Message]) -> None:
        """Put ``messages`` on the surface in place of what it shows (after the record's
        commit: a failure here is logged, and the record stays)."""
        try:
            surface = actor.log.surface()
            if not surface:
                if messages:
                    await actor.append_many(_message_items(messages))
            elif messages:
                await actor.replace(surface[0].position, surface[-1].position, messages)
            else:
                await actor.remove(surface[0].position, surface[-1].position)
        except (StoreError, OutcomeUnknownError, InvalidEventError) as error:
            _logger.warning(
                "nous_session.pydantic_ai_surface_not_replaced",
                session_id=actor.session_id,
                error=repr(error),
            )
