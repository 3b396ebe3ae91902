"""The LangGraph saver's calls from elsewhere than its event loop: its async methods awaited
from another loop, and its synchronous methods called from another thread, are carried to the
loop the saver runs on (its actors, events and locks belong to that one)."""

from __future__ import annotations

import functools
import threading
from collections.abc import Callable, Coroutine, Iterator, Sequence
from typing import Any, TypeVar

import anyio
import anyio.from_thread
import anyio.lowlevel
import anyio.to_thread
from langchain_core.runnables import RunnableConfig
from langgraph.checkpoint.base import (
    BaseCheckpointSaver,
    ChannelVersions,
    Checkpoint,
    CheckpointMetadata,
    CheckpointTuple,
)

from nous_session.integrations._langgraph_threads import Threads

_T = TypeVar("_T")

_AWAITED_ON_LOOP_THREAD = (
    "NousSessionSaver was awaited from another event loop on the thread of the loop it was "
    "opened in, which is therefore not running: use the saver from its own loop, or from a "
    "loop in another thread while its own runs"
)
_SYNC_ON_LOOP_THREAD = (
    "NousSessionSaver's synchronous methods run on its event loop from another thread; on the "
    "loop's own thread they would deadlock: use the async ones (graph.ainvoke, graph.astream, "
    "saver.aget_tuple, ...)"
)


class SyncSaver(BaseCheckpointSaver[str]):
    """The part of :class:`~nous_session.integrations.langgraph.NousSessionSaver` that
    carries calls to its loop: the synchronous interface, over the async one."""

    _threads: Threads
    _token: anyio.lowlevel.EventLoopToken
    _loop_thread: int  # the id of the thread the saver's loop runs on

    async def _from_other_loop(
        self, function: Callable[..., Coroutine[Any, Any, _T]], *args: Any, **kwargs: Any
    ) -> _T:
        """Run ``function`` on the saver's event loop for a task of another loop: a worker
        thread of the caller's loop waits for it (a cancelled caller waits too, so a write
        never ends half-known).

        Raises:
            RuntimeError: the saver is closed, or its loop is not running (the caller's loop
                runs on the saver's thread).
        """
        if self._threads.closed:
            raise RuntimeError("the NousSessionSaver is closed")
        self._refuse_on_loop_thread(_AWAITED_ON_LOOP_THREAD)
        call = functools.partial(function, *args, **kwargs)
        return await anyio.to_thread.run_sync(
            functools.partial(anyio.from_thread.run, call, token=self._token)
        )

    def _refuse_on_loop_thread(self, why: str) -> None:
        """Raise RuntimeError(``why``) on the thread of the saver's loop, where a call
        waiting for that loop would never be answered."""
        if threading.get_ident() == self._loop_thread:
            raise RuntimeError(why)

    async def _listed(
        self,
        config: RunnableConfig | None,
        *,
        filter: dict[str, Any] | None,
        before: RunnableConfig | None,
        limit: int | None,
    ) -> list[CheckpointTuple]:
        """:meth:`alist`'s checkpoints, read whole (for a caller on another loop or thread)."""
        return [
            item async for item in self.alist(config, filter=filter, before=before, limit=limit)
        ]

    # The sync interface -----------------------------------------------------------------------

    def _sync(
        self, function: Callable[..., Coroutine[Any, Any, _T]], *args: Any, **kwargs: Any
    ) -> _T:
        self._refuse_on_loop_thread(_SYNC_ON_LOOP_THREAD)
        return anyio.from_thread.run(
            functools.partial(function, *args, **kwargs), token=self._token
        )

    def get_tuple(self, config: RunnableConfig) -> CheckpointTuple | None:
        """:meth:`aget_tuple`, from a thread other than the saver's event loop."""
        return self._sync(self.aget_tuple, config)

    def list(
        self,
        config: RunnableConfig | None,
        *,
        filter: dict[str, Any] | None = None,  # LangGraph's name
        before: RunnableConfig | None = None,
        limit: int | None = None,
    ) -> Iterator[CheckpointTuple]:
        """:meth:`alist`, from a thread other than the saver's event loop (read at once)."""
        return iter(self._sync(self._listed, config, filter=filter, before=before, limit=limit))

    def put(
        self,
        config: RunnableConfig,
        checkpoint: Checkpoint,
        metadata: CheckpointMetadata,
        new_versions: ChannelVersions,
    ) -> RunnableConfig:
        """:meth:`aput`, from a thread other than the saver's event loop."""
        return self._sync(self.aput, config, checkpoint, metadata, new_versions)

    def put_writes(
        self,
        config: RunnableConfig,
        writes: Sequence[tuple[str, Any]],
        task_id: str,
        task_path: str = "",
    ) -> None:
        """:meth:`aput_writes`, from a thread other than the saver's event loop."""
        self._sync(self.aput_writes, config, writes, task_id, task_path)

    def delete_thread(self, thread_id: str) -> None:
        """:meth:`adelete_thread`, from a thread other than the saver's event loop."""
        self._sync(self.adelete_thread, thread_id)

    def delete_for_runs(self, run_ids: Sequence[str]) -> None:
        """:meth:`adelete_for_runs`, from a thread other than the saver's event loop."""
        self._sync(self.adelete_for_runs, run_ids)

    def copy_thread(self, source_thread_id: str, target_thread_id: str) -> None:
        """:meth:`acopy_thread`, from a thread other than the saver's event loop."""
        self._sync(self.acopy_thread, source_thread_id, target_thread_id)

    def prune(self, thread_ids: Sequence[str], *, strategy: str = "keep_latest") -> None:
        """:meth:`aprune`, from a thread other than the saver's event loop."""
        self._sync(self.aprune, thread_ids, strategy=strategy)
