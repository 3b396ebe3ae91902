"""The LangGraph saver's threads: each thread's open session (kept open while in use, the least
recently used idle ones closed beyond a bound) and the index of what its events say."""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import AsyncIterator, Iterator, Mapping, Sequence
from contextlib import asynccontextmanager
from typing import Any, Final

import anyio
import anyio.abc

from nous_session.actor import SessionActor
from nous_session.event import Event
from nous_session.stores.base import Store

CHECKPOINT_EVENT: Final = "x.langgraph.checkpoint"
"""The custom event type of a checkpoint (``aput``)."""
WRITES_EVENT: Final = "x.langgraph.writes"
"""The custom event type of a task's pending writes (``aput_writes``)."""
DELETED_EVENT: Final = "x.langgraph.deleted"
"""The custom event type recording checkpoints deleted (``adelete_for_runs``, ``aprune``)."""

# One checkpoint's pending writes: (task id, idx) -> (task id, channel, typed value, task path)
_Writes = dict[tuple[str, int], tuple[str, str, tuple[str, str], str]]


class Index:
    """What a thread's events say, folded in seq order: its checkpoints, blobs and writes.

    Values stay as stored (a serde type name and base64 text) until a reader asks for them.
    """

    __slots__ = ("blobs", "checkpoints", "count", "deletions", "writes")

    def __init__(self) -> None:
        self.count = 0  # events folded: every seq below this
        # ns -> checkpoint id -> the checkpoint event's data
        self.checkpoints: dict[str, dict[str, Mapping[str, Any]]] = {}
        # (ns, channel, version) -> typed value
        self.blobs: dict[tuple[str, str, Any], tuple[str, str]] = {}
        self.writes: dict[tuple[str, str], _Writes] = {}
        self.deletions = 0  # deleted-checkpoints events folded

    def fold(self, events: Sequence[Event], count: int) -> None:
        for event in events:
            if event.seq < self.count:
                continue
            kind = event.type
            if kind == CHECKPOINT_EVENT:
                self._checkpoint(event.data)
            elif kind == WRITES_EVENT:
                self._writes(event.data)
            elif kind == DELETED_EVENT:
                self.deletions += 1
                gone = event.data["checkpoints"]
                assert isinstance(gone, list)  # [[ns, checkpoint id], ...], as the saver wrote
                for pair in gone:
                    assert isinstance(pair, list)
                    ns, checkpoint_id = (str(item) for item in pair)
                    self.checkpoints.get(ns, {}).pop(checkpoint_id, None)
                    self.writes.pop((ns, checkpoint_id), None)
        self.count = max(self.count, count)

    def _checkpoint(self, data: Mapping[str, Any]) -> None:
        ns = data["ns"]
        self.checkpoints.setdefault(ns, {})[data["id"]] = data
        for channel, version, kind, value in data["blobs"]:
            self.blobs[(ns, channel, version_key(version))] = (kind, value)

    def _writes(self, data: Mapping[str, Any]) -> None:
        stored = self.writes.setdefault((data["ns"], data["checkpoint"]), {})
        task_id, path = data["task"], data["path"]
        for idx, channel, kind, value in data["writes"]:
            if idx >= 0 and (task_id, idx) in stored:
                continue  # stored already: a retried write is not a second write
            stored[(task_id, idx)] = (task_id, channel, (kind, value), path)

    def latest(self, ns: str) -> str | None:
        held = self.checkpoints.get(ns)
        return max(held) if held else None

    def listed(
        self, ns: str | None, checkpoint_id: str | None, before: str | None
    ) -> Iterator[tuple[str, Mapping[str, Any]]]:
        """The checkpoints (namespace, event data), newest first in each namespace: only
        ``ns``'s when given, only the one ``checkpoint_id`` names when given, only ids below
        ``before`` when given. Read as the caller goes: one deleted meanwhile is left out."""
        for held_ns, held in list(self.checkpoints.items()):
            if ns is not None and held_ns != ns:
                continue
            for held_id in sorted(held, reverse=True):
                if (checkpoint_id and held_id != checkpoint_id) or (before and held_id >= before):
                    continue
                data = held.get(held_id)
                if data is not None:  # else deleted while the caller was reading
                    yield held_ns, data


def version_key(version: Any) -> Any:
    """A channel version as a key: JSON keeps ints, floats and strings apart as LangGraph
    does; a list would not hash."""
    return tuple(version) if isinstance(version, list) else version


class Thread:
    """A thread's open session: its actor task, the index of its events, and its users."""

    __slots__ = ("actor", "done", "index", "opened", "release", "session_id", "users")

    def __init__(self, session_id: str) -> None:
        self.session_id = session_id
        self.actor: SessionActor | None = None
        self.opened = anyio.Event()  # set once opening succeeded or failed
        self.release = anyio.Event()  # set to close the actor
        self.done = anyio.Event()  # set once the actor is closed
        self.index = Index()
        self.users = 0  # calls in progress (and session() blocks): never evicted meanwhile

    def indexed(self) -> Index:
        """The index, caught up with the actor's committed log."""
        assert self.actor is not None
        log = self.actor.log
        if log.count > self.index.count:
            self.index.fold(log.since(self.index.count), log.count)
        return self.index


class Threads:
    """The open threads of a saver (and of the copies LangGraph makes of it, which share
    this object): one actor task each in the saver's task group, at most ``max_open`` kept
    open when idle, least recently used first out."""

    def __init__(self, store: Store, task_group: anyio.abc.TaskGroup, max_open: int) -> None:
        self._store = store
        self._task_group = task_group
        self._max_open = max_open
        # The open threads, least recently used first.
        self._open: OrderedDict[str, Thread] = OrderedDict()
        self._closing: dict[str, Thread] = {}  # released, actor still closing
        self.closed = False

    def __len__(self) -> int:
        """How many threads are open."""
        return len(self._open)

    @asynccontextmanager
    async def use(self, session_id: str) -> AsyncIterator[Thread]:
        """The thread's open session, opened on first use, kept open while the block runs."""
        while True:
            if self.closed:
                raise RuntimeError("the NousSessionSaver is closed")
            thread = self._open.get(session_id)
            if thread is None:
                thread = await self._open_thread(session_id)
                break
            thread.users += 1
            try:
                await thread.opened.wait()
            except BaseException:
                thread.users -= 1
                raise
            if thread.actor is not None and not thread.release.is_set():
                break
            thread.users -= 1  # its opening failed, or it was closed meanwhile: try again
        self._open.move_to_end(session_id)
        try:
            yield thread
        finally:
            thread.users -= 1
            if len(self._open) > self._max_open:
                self._evict()  # what was busy when the last thread opened may be idle now

    def close(self) -> None:
        """Refuse new uses, and close every open thread (in the background)."""
        self.closed = True
        for thread in list(self._open.values()):
            self._release(thread)

    async def forget(self, session_id: str) -> None:
        """Close the thread's actor, if open, and wait until it is (before the store changes
        the session under it)."""
        thread = self._open.get(session_id)
        if thread is not None:
            await thread.opened.wait()
            self._release(thread)
        previous = self._closing.get(session_id)
        if previous is not None:
            await previous.done.wait()

    async def index(self, session_id: str) -> Index:
        """The thread's index: from its open actor, else read from the store once."""
        thread = self._open.get(session_id)
        if thread is not None and thread.actor is not None:
            return thread.indexed()
        index = Index()
        events = await self._store.load(session_id)
        index.fold(events, events[-1].seq + 1 if events else 0)
        return index

    async def _open_thread(self, session_id: str) -> Thread:
        """Open the thread's session (the caller becomes its first user)."""
        thread = Thread(session_id)
        thread.users = 1
        self._open[session_id] = thread
        try:
            previous = self._closing.get(session_id)
            if previous is not None:
                await previous.done.wait()  # one actor per session in this process
            await self._task_group.start(self._hold, thread)
        except BaseException:
            if self._open.get(session_id) is thread:
                del self._open[session_id]
            raise
        finally:
            thread.opened.set()
        self._evict()
        return thread

    async def _hold(
        self,
        thread: Thread,
        *,
        task_status: anyio.abc.TaskStatus[None] = anyio.TASK_STATUS_IGNORED,
    ) -> None:
        try:
            # Checkpoints are plain appends: with other writers on the session (other
            # processes), the store puts them after whatever it holds instead of failing.
            async with SessionActor.open(
                session_id=thread.session_id, store=self._store, follow=False, on_conflict="rebase"
            ) as actor:
                thread.actor = actor
                task_status.started()
                await thread.release.wait()
        finally:
            thread.done.set()
            if self._closing.get(thread.session_id) is thread:
                del self._closing[thread.session_id]

    def _release(self, thread: Thread) -> None:
        """Close the thread's actor (in the background) and forget it."""
        if self._open.get(thread.session_id) is thread:
            del self._open[thread.session_id]
        if not thread.done.is_set():
            self._closing[thread.session_id] = thread
        thread.release.set()

    def _evict(self) -> None:
        """Close the least recently used idle threads beyond ``max_open``."""
        excess = len(self._open) - self._max_open
        for thread in list(self._open.values()):
            if excess <= 0:
                break
            if thread.users == 0 and thread.actor is not None:
                self._release(thread)
                excess -= 1
