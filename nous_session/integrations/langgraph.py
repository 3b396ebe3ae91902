"""A LangGraph checkpointer that keeps each thread in a nous_session session.

:class:`NousSessionSaver` is a full ``BaseCheckpointSaver``: LangGraph's checkpoints and pending
writes become custom events of the session that stands for the thread, so they are stored,
streamed (``session.subscribe``), exported and kept by snapshots like every event, in any
nous_session store (memory, SQLite, PostgreSQL)::

    async with NousSessionSaver.open("sqlite:///sessions.sqlite3") as saver:
        graph = builder.compile(checkpointer=saver)
        await graph.ainvoke({"messages": [("user", "hi")]}, {"configurable": {"thread_id": "t1"}})

The mapping:

* **One session per thread**: session id ``session_prefix + str(thread_id)`` (default prefix
  ``"langgraph:"``); every ``checkpoint_ns`` of the thread (subgraphs) lives in that session,
  each event naming its namespace. One :class:`~nous_session.SessionActor` per thread in use
  serialises its writes (and group-commits concurrent ones); at most ``max_open_threads`` stay
  open, the least recently used idle one closing (and reopening from the store when needed).
* ``x.langgraph.checkpoint``: ``aput``. The checkpoint without its channel values and the
  metadata, each as LangGraph's own serde made it (``serde.dumps_typed``: a type name and
  base64 bytes), its parent id, and a blob for each channel in ``new_versions`` (the
  channels that changed): a channel's value at a version is stored once, as LangGraph's own
  savers do, and a checkpoint is rebuilt from the blobs of its ``channel_versions``. It
  carries the digest of what it stores, and its append a key made of that digest and of what
  it overwrites: putting the same checkpoint again (after an ``OutcomeUnknownError``, say)
  stores nothing more, and its messages reach the surface once.
* ``x.langgraph.writes``: ``aput_writes``. A task's pending writes for one checkpoint, with
  their indexes; a write already stored for ``(task_id, idx)`` is not stored again, and the
  special channels (errors, interrupts) replace theirs, as in LangGraph's ``InMemorySaver``.
* ``x.langgraph.deleted``: ``adelete_for_runs`` and ``aprune``. The log is append-only, so
  these record which checkpoints (and their writes) are gone instead of erasing them: the
  saver never returns them again, and the log still tells what happened. ``adelete_thread``
  deletes the whole session from the store. ``acopy_thread`` forks the session (the target
  shares the source's history; a target that exists already gets copies of the events).
* **The surface.** When a root checkpoint's ``messages`` channel (``messages_channel``) holds
  LangChain messages, they are also put on the session's surface as nous_session messages,
  so ``session.messages()`` and ``nous-session messages langgraph:t1`` show the
  conversation: new messages are appended with the checkpoint, in the same commit; a list
  that no longer extends what the surface shows (a removed or edited message, a branch from
  an older checkpoint) replaces the surface in one ``replace`` event, history kept. Each
  message carries its LangChain id in ``metadata["langgraph_id"]``. ``messages_channel=None``
  turns this off. Only the checkpoint events are read back: the surface is a view.

The saver runs on the event loop it was opened in (asyncio or trio: the saver itself is
anyio; LangGraph runs graphs on asyncio). Its ``a...`` methods may be awaited from any event
loop while that one runs: from another loop (another thread's), the call is carried to the
saver's loop by a worker thread of the caller's and waited for there (``alist`` then reads
its whole result at once). :meth:`NousSessionSaver.session` hands out the thread's actor,
which belongs to the saver's loop, so it refuses other loops at once. Its synchronous methods
(``graph.invoke``) work from any other thread while that loop runs; from the loop's own
thread they raise RuntimeError (they would deadlock), use the ``a...`` methods there.

Several processes (or savers) may run one thread: checkpoints are appended with the store's
rebasing commit, so they never conflict, and each read first catches up with the store
(``catch_up=True``, one short query).
"""

from __future__ import annotations

import functools
import random
import threading
from collections.abc import AsyncIterator, Callable, Coroutine, Sequence
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from typing import Any, Concatenate, Final, ParamSpec, TypeVar

import anyio
import anyio.abc
import anyio.from_thread
import anyio.lowlevel

from nous_session.integrations._common import StoreHost, missing_extra, opened_store

try:
    from langchain_core.runnables import RunnableConfig
    from langgraph.checkpoint.base import (
        WRITES_IDX_MAP,
        ChannelVersions,
        Checkpoint,
        CheckpointMetadata,
        CheckpointTuple,
        get_checkpoint_id,
    )
    from langgraph.checkpoint.serde.base import SerializerProtocol
except ImportError as error:  # pragma: no cover - the extra is installed for the tests
    raise missing_extra(__name__, "LangGraph", "langgraph") from error

from nous_session._json import JSON
from nous_session.actor import SessionActor
from nous_session.event import EventType
from nous_session.integrations._langgraph_records import (
    checkpoint_record,
    checkpoint_tuple,
    dump,
    load,
    thread_config,
)
from nous_session.integrations._langgraph_surface import MessagesProjection
from nous_session.integrations._langgraph_sync import SyncSaver
from nous_session.integrations._langgraph_threads import (
    CHECKPOINT_EVENT,
    DELETED_EVENT,
    WRITES_EVENT,
    Thread,
    Threads,
)
from nous_session.integrations._listing import listed_ids
from nous_session.metadata import SessionMetadata
from nous_session.stores.base import Store

__all__ = [
    "CHECKPOINT_EVENT",
    "DELETED_EVENT",
    "LISTED_APP",
    "WRITES_EVENT",
    "NousSessionSaver",
]

LISTED_APP: Final = "langgraph"
"""The ``app`` of a thread's session metadata, and the ``extra`` key holding the saver's
session prefix: how the saver lists its threads through the store's index."""

_T = TypeVar("_T")
_P = ParamSpec("_P")


def _any_loop(
    method: Callable[Concatenate[NousSessionSaver, _P], Coroutine[Any, Any, _T]],
) -> Callable[Concatenate[NousSessionSaver, _P], Coroutine[Any, Any, _T]]:
    """Let the saver's async ``method`` be awaited from any event loop: on another loop than
    the saver's, the call runs on the saver's (its actors, events and locks belong to that
    one: awaited from elsewhere they would never wake)."""

    @functools.wraps(method)
    async def call(self: NousSessionSaver, /, *args: _P.args, **kwargs: _P.kwargs) -> _T:
        if anyio.lowlevel.current_token() == self._token:
            return await method(self, *args, **kwargs)
        return await self._from_other_loop(method, self, *args, **kwargs)

    return call


class NousSessionSaver(StoreHost, SyncSaver):
    """A LangGraph checkpointer over a nous_session store; see the module's docstring.

    Open it with :meth:`open` (an ``async with`` block): it owns one task per thread in use,
    and closes them (and a store it opened from a URL) when the block ends.
    """

    def __init__(
        self,
        key: object,
        store: Store,
        threads: Threads,
        *,
        serde: SerializerProtocol | None,
        session_prefix: str,
        messages_channel: str | None,
        catch_up: bool,
    ) -> None:
        if key is not _OPEN_KEY:
            raise TypeError("use `async with NousSessionSaver.open(store) as saver`")
        super().__init__(serde=serde)
        self._store = store
        self._prefix = session_prefix
        # Each thread's session says it is one of this saver's (for listing every thread
        # through the store's index instead of reading every session id).
        self._record = SessionMetadata(app=LISTED_APP, extra={LISTED_APP: session_prefix})
        self._surface = MessagesProjection(messages_channel)
        self._catch_up = catch_up
        # Shared with the copies LangGraph makes of a checkpointer (with_allowlist): a copy
        # of a closed saver is closed too.
        self._threads = threads
        self._token = anyio.lowlevel.current_token()
        self._loop_thread = threading.get_ident()

    @classmethod
    @asynccontextmanager
    async def open(
        cls,
        store: Store | str | None = None,
        *,
        serde: SerializerProtocol | None = None,
        session_prefix: str = "langgraph:",
        messages_channel: str | None = "messages",
        max_open_threads: int = 256,
        catch_up: bool = True,
    ) -> AsyncIterator[NousSessionSaver]:
        """Run a saver for the duration of the ``async with`` block.

        Args:
            store: a nous_session Store, or a URL for :func:`~nous_session.open_store` (the
                saver then owns and closes it); None: the store ``NOUS_SESSION_STORE``
                names, else a private in-memory store.
            serde: LangGraph's serializer for checkpoints and writes (default: LangGraph's
                ``JsonPlusSerializer``).
            session_prefix: put before a thread id to make its session id (a session id is
                at most 256 UTF-8 bytes).
            messages_channel: the channel whose LangChain messages are projected onto the
                session's surface; None projects nothing.
            max_open_threads: how many threads keep their session open (its actor and its
                log in memory) between calls; beyond it the least recently used idle one is
                closed, and opened again from the store when next used.
            catch_up: read a thread's latest state from the store before each read
                (``aget_tuple``, ``alist``): one short query, so that a thread that other
                processes or other savers also run (several servers on one PostgreSQL
                database) is never read stale. False trusts this saver to be the only writer
                of the threads it reads.

        Raises:
            ValueError: a bad argument.
        """
        if type(max_open_threads) is not int or max_open_threads < 1:
            raise ValueError(f"max_open_threads must be an int >= 1, got {max_open_threads!r}")
        async with opened_store(store) as resolved, anyio.create_task_group() as task_group:
            # The block owns the thread table: its sessions' tasks run in the block's group.
            threads = Threads(resolved, task_group, max_open_threads)
            try:
                yield cls(
                    _OPEN_KEY,
                    resolved,
                    threads,
                    serde=serde,
                    session_prefix=session_prefix,
                    messages_channel=messages_channel,
                    catch_up=catch_up,
                )
            finally:
                threads.close()

    def session_id(self, thread_id: object) -> str:
        """The id of the session that holds ``thread_id``."""
        return f"{self._prefix}{thread_id}"

    @asynccontextmanager
    async def session(self, thread_id: object) -> AsyncIterator[SessionActor]:
        """The open session of ``thread_id``, for the ``async with`` block: to follow its
        checkpoints live (``subscribe``), read its surface, or append events of your own.

        The saver's own actor for the thread (a second actor on a SQLite store would not see
        the saver's commits); it is not closed for want of room while the block runs.

        Raises:
            RuntimeError: called from another event loop than the saver's (the actor belongs
                to the saver's loop, and would never answer there).
        """
        if anyio.lowlevel.current_token() != self._token:
            raise RuntimeError(
                "NousSessionSaver.session() hands out an actor of the saver's own event loop;"
                " this task runs on another one: use it from the loop the saver was opened in"
            )
        async with self._use(thread_id) as thread:
            assert thread.actor is not None
            yield thread.actor

    def _use(self, thread_id: object) -> AbstractAsyncContextManager[Thread]:
        """The thread's open session, for the ``async with`` block."""
        return self._threads.use(self.session_id(thread_id))

    async def _session_ids(self) -> list[str]:
        """The sessions of this saver's threads: from the store's index (those with this
        saver's metadata, set by their first checkpoint) when the store has one, else every
        session id with the prefix. Oldest first."""
        store = self._store
        where = {"app": LISTED_APP, LISTED_APP: self._prefix}
        found = await listed_ids(store, where, self._prefix, oldest_first=True)
        if found is None:
            return [
                info.session_id
                for info in await store.sessions()
                if info.session_id.startswith(self._prefix)
            ]
        return found

    # The async interface ----------------------------------------------------------------------

    @_any_loop
    async def aget_tuple(self, config: RunnableConfig) -> CheckpointTuple | None:
        """The checkpoint ``config`` names (its ``checkpoint_id``), else the thread's latest
        in its ``checkpoint_ns``; None when there is none."""
        conf = config["configurable"]
        thread_id = conf["thread_id"]
        ns = conf.get("checkpoint_ns", "")
        async with self._use(thread_id) as thread:
            if self._catch_up:
                assert thread.actor is not None
                await thread.actor.reload()
            index = thread.indexed()
        checkpoint_id = get_checkpoint_id(config) or index.latest(ns)
        data = index.checkpoints.get(ns, {}).get(checkpoint_id) if checkpoint_id else None
        return None if data is None else checkpoint_tuple(self.serde, thread_id, ns, data, index)

    async def alist(
        self,
        config: RunnableConfig | None,
        *,
        filter: dict[str, Any] | None = None,  # LangGraph's name
        before: RunnableConfig | None = None,
        limit: int | None = None,
    ) -> AsyncIterator[CheckpointTuple]:
        """The checkpoints of ``config``'s thread (every thread's when None), newest first
        in each namespace, filtered by ``config``'s ``checkpoint_ns`` and ``checkpoint_id``,
        by metadata equal to ``filter``'s items, and to ids below ``before``'s."""
        if anyio.lowlevel.current_token() != self._token:
            # On another loop: read the whole listing on the saver's, then hand it out.
            listing = functools.partial(
                self.alist, config, filter=filter, before=before, limit=limit
            )
            listed = self._from_other_loop(self._collected, listing)
            for item in await listed:
                yield item
            return
        if config is None:
            threads: list[tuple[object, str]] = [
                (session_id[len(self._prefix) :], session_id)
                for session_id in await self._session_ids()
            ]
            want_ns = want_id = None
        else:
            conf = config["configurable"]
            async with self._use(conf["thread_id"]) as thread:  # opened: it is in use
                if self._catch_up:
                    assert thread.actor is not None
                    await thread.actor.reload()
                threads = [(conf["thread_id"], thread.session_id)]
            want_ns = conf.get("checkpoint_ns")
            want_id = get_checkpoint_id(config)
        before_id = get_checkpoint_id(before) if before else None
        remaining = limit
        for thread_id, session_id in threads:
            index = await self._threads.index(session_id)
            for ns, data in index.listed(want_ns, want_id, before_id):
                if filter:
                    metadata = load(self.serde, data["metadata"])
                    if not all(metadata.get(k) == v for k, v in filter.items()):
                        continue
                if remaining is not None:
                    if remaining <= 0:
                        return
                    remaining -= 1
                yield checkpoint_tuple(self.serde, thread_id, ns, data, index)

    @_any_loop
    async def aput(
        self,
        config: RunnableConfig,
        checkpoint: Checkpoint,
        metadata: CheckpointMetadata,
        new_versions: ChannelVersions,
    ) -> RunnableConfig:
        """Store ``checkpoint`` (one ``x.langgraph.checkpoint`` event, committed before this
        returns) with the values of the channels in ``new_versions``."""
        conf = config["configurable"]
        thread_id = conf["thread_id"]
        ns = conf.get("checkpoint_ns", "")
        data, digest = checkpoint_record(self.serde, config, checkpoint, metadata, new_versions)
        async with self._use(thread_id) as thread:
            actor = thread.actor
            assert actor is not None
            index = thread.indexed()
            held = index.checkpoints.get(ns, {}).get(checkpoint["id"])
            if held is not None and held.get("digest") == digest:
                return thread_config(thread_id, ns, checkpoint["id"])  # this very one: stored
            # Keyed by what it stores and what it overwrites (an earlier version of the
            # checkpoint, or deletions since): a put tried again after its commit's outcome
            # was unknown stores it once, while putting it over a later one stores it anew.
            over = "" if held is None else str(held.get("digest"))
            key = f"lg:{digest}:{over}:{index.deletions}"
            items: list[tuple[Any, ...]] = [(CHECKPOINT_EVENT, data)]
            if actor.metadata != self._record:  # its first checkpoint (in this version)
                items.append((EventType.METADATA, {"metadata": self._record.to_json()}))
            new, replacement = self._surface.change(actor, ns, checkpoint["channel_values"])
            items.extend(new)  # new messages: in the checkpoint's commit
            await actor.append_many(items, key=key)
            if replacement is not None:
                await self._surface.replace(actor, replacement)
        return thread_config(thread_id, ns, checkpoint["id"])

    @_any_loop
    async def aput_writes(
        self,
        config: RunnableConfig,
        writes: Sequence[tuple[str, Any]],
        task_id: str,
        task_path: str = "",
    ) -> None:
        """Store a task's pending writes for ``config``'s checkpoint (one
        ``x.langgraph.writes`` event; nothing when every write is stored already)."""
        conf = config["configurable"]
        ns = conf.get("checkpoint_ns", "")
        checkpoint_id = conf["checkpoint_id"]
        async with self._use(conf["thread_id"]) as thread:
            assert thread.actor is not None
            stored = thread.indexed().writes.get((ns, checkpoint_id), {})
            items: list[JSON] = []
            for position, (channel, value) in enumerate(writes):
                idx = WRITES_IDX_MAP.get(channel, position)
                if idx >= 0 and (task_id, idx) in stored:
                    continue
                items.append([idx, channel, *dump(self.serde, value)])
            if items:
                await thread.actor.append(
                    WRITES_EVENT,
                    {
                        "ns": ns,
                        "checkpoint": checkpoint_id,
                        "task": task_id,
                        "path": task_path,
                        "writes": items,
                    },
                )

    @_any_loop
    async def adelete_thread(self, thread_id: str) -> None:
        """Delete the thread's session, and everything in it, from the store."""
        session_id = self.session_id(thread_id)
        await self._threads.forget(session_id)
        await self._store.delete(session_id)

    @_any_loop
    async def adelete_for_runs(self, run_ids: Sequence[str]) -> None:
        """Mark every checkpoint made by one of ``run_ids`` deleted, with its writes (one
        ``x.langgraph.deleted`` event per thread that has any)."""
        wanted = set(run_ids)
        if not wanted:
            return
        for session_id in await self._session_ids():
            index = await self._threads.index(session_id)
            gone: list[JSON] = [
                [ns, checkpoint_id]
                for ns, held in index.checkpoints.items()
                for checkpoint_id, data in held.items()
                if data.get("run_id") in wanted
            ]
            if gone:
                thread_id = session_id[len(self._prefix) :]
                await self._mark_deleted(thread_id, gone)

    @_any_loop
    async def acopy_thread(self, source_thread_id: str, target_thread_id: str) -> None:
        """Give the target thread the source's checkpoints and writes: a fork of the source's
        session when the target has none, else copies of the source's LangGraph events
        appended to it."""
        source = self.session_id(source_thread_id)
        target = self.session_id(target_thread_id)
        events = await self._store.load(source)
        if not events:
            return
        await self._threads.forget(target)
        if not await self._store.load(target):
            async with self._use(source_thread_id) as thread:
                assert thread.actor is not None
                await thread.actor.fork(target)
            return
        async with self._use(target_thread_id) as thread:
            assert thread.actor is not None
            await thread.actor.append_many(
                (event.type, event.data)
                for event in events
                if event.type in (CHECKPOINT_EVENT, WRITES_EVENT, DELETED_EVENT)
            )

    @_any_loop
    async def aprune(self, thread_ids: Sequence[str], *, strategy: str = "keep_latest") -> None:
        """``"keep_latest"``: mark every checkpoint but each namespace's latest deleted;
        ``"delete"``: mark them all deleted. The sessions and their surfaces stay."""
        if strategy not in ("keep_latest", "delete"):
            raise ValueError(f'strategy must be "keep_latest" or "delete", got {strategy!r}')
        for thread_id in thread_ids:
            index = await self._threads.index(self.session_id(thread_id))
            gone: list[JSON] = []
            for ns, held in index.checkpoints.items():
                keep = index.latest(ns) if strategy == "keep_latest" else None
                gone.extend([ns, checkpoint_id] for checkpoint_id in held if checkpoint_id != keep)
            if gone:
                await self._mark_deleted(thread_id, gone)

    async def _mark_deleted(self, thread_id: object, gone: list[JSON]) -> None:
        async with self._use(thread_id) as thread:
            assert thread.actor is not None
            await thread.actor.append(DELETED_EVENT, {"checkpoints": gone})

    def get_next_version(self, current: str | int | None, channel: None) -> str:
        """A version above ``current``: a counter and a random fraction, as LangGraph's own
        savers make them, so two branches from one checkpoint never share a blob's key."""
        if current is None:
            number = 0
        elif isinstance(current, int):
            number = current
        else:
            number = int(current.split(".")[0])
        return f"{number + 1:032}.{random.random():016}"  # a tie-breaker, not a secret


_OPEN_KEY: Final = object()
