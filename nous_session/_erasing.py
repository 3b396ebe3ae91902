"""The actor's side of erasure: a barrier request that erases in the store between two
commits, then republishes the session's Log from the store.

It runs in the actor task like a catch-up (:class:`~nous_session._requests.Reload`): the
requests before it are committed first, the ones after it apply to the erased log, and no
commit of this actor runs while the store rewrites the rows.
"""

from __future__ import annotations

from datetime import datetime

from nous_session._follower import restored
from nous_session._requests import Request
from nous_session._state import SessionState, store_error
from nous_session.log import Log
from nous_session.stores.base import ErasingStore, supports

__all__ = ["Erase"]


class Erase(Request):
    """Erase the events at ``seqs`` (checked in the caller); the result is the store's
    :class:`~nous_session.erasure.Erasure`."""

    __slots__ = ("at", "reason", "seqs")

    barrier = True

    def __init__(self, seqs: tuple[int, ...], reason: str, at: datetime) -> None:
        super().__init__()
        self.seqs = seqs
        self.reason = reason
        self.at = at

    async def run_barrier(self, state: SessionState) -> None:
        """Erase in the store, then read the session again and publish it; answer the caller.

        A bad seq (past the store's count) fails the caller with ValueError and changes
        nothing. If the store erased but the session cannot be read again, the caller gets
        the StoreError and the published Log stays as it was until the next catch-up.
        """
        store = state.store
        if not supports(store, ErasingStore):
            self.fail(
                TypeError(f"{type(store).__name__} cannot erase events (no ErasingStore.erase)")
            )
            return
        try:
            result = await store.erase(state.session_id, self.seqs, reason=self.reason, at=self.at)
        except ValueError as error:
            self.fail(error)
            return
        except Exception as error:
            self.fail(store_error(error))
            return
        try:
            if state.full_store:
                stored = await store.read(state.session_id)
                log = restored(state.session_id, stored)
                state.keys = dict(stored.keys)
                state.kept = {event.seq: event for event in stored.kept}
            else:
                log = Log.restore(await store.load(state.session_id))
        except Exception as error:
            self.fail(store_error(error))
            return
        # Events changed in place: subscribers' positions stay valid (the seqs are the
        # same), and what a subscriber reads from now on is the erased form.
        state.published.publish(log, dropped=True)
        if state.compaction is not None:
            state.compaction.committed(log, rebuilt=True)
        self.resolve(result)
