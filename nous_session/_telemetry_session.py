"""What one session actor reports when telemetry is active: its spans, metrics and gauges, and
its store traced by a proxy. See :mod:`nous_session.telemetry`."""

from __future__ import annotations

import inspect
import time
from collections.abc import Awaitable, Callable, Coroutine, Sequence
from typing import TYPE_CHECKING, Any

import anyio
import anyio.abc

from nous_session.errors import ConflictError, OutcomeUnknownError

if TYPE_CHECKING:
    from opentelemetry.trace import Span

    from nous_session._requests import Request
    from nous_session._state import SessionState
    from nous_session.subscription import Published
from nous_session._telemetry_instruments import (
    ATTEMPTS,
    BATCH_SIZE,
    COMMITS,
    COMPACTION_OUTCOME,
    ERROR_TYPE,
    EVENTS,
    OPERATION,
    OUTCOME,
    SESSION_ID,
    STORE_KIND,
    TRACED,
    Instruments,
    Outcome,
    store_kind,
)


class SessionTelemetry:
    """What one session actor reports, and the hooks the actor calls (only when telemetry is
    active: an actor without telemetry has None instead of this object).

    The hooks, in the order an actor uses them: :attr:`store` (its store, traced),
    :meth:`opened`, :meth:`detached` (its task), :meth:`traced_commit` (its engine's commit),
    :meth:`compaction_started` / :meth:`compaction_finished`, :meth:`closed`.
    """

    __slots__ = (
        "_commit_attributes",
        "_outcome_attributes",
        "_published",
        "_queue_depth",
        "_store_attributes",
        "instruments",
        "kind",
        "last_commit",
        "metric_attributes",
        "per_session",
        "session_id",
        "span_attributes",
        "store",
        "store_commits",
    )

    def __init__(
        self, instruments: Instruments, session_id: str, store: object, *, per_session: bool
    ) -> None:
        self.instruments = instruments
        self.session_id = session_id
        self.per_session = per_session
        self.kind = store_kind(store)
        self.span_attributes: dict[str, Any] = {SESSION_ID: session_id, STORE_KIND: self.kind}
        self.metric_attributes: dict[str, Any] = {STORE_KIND: self.kind}
        if per_session:
            self.metric_attributes[SESSION_ID] = session_id
        self._outcome_attributes: dict[str, dict[str, Any]] = {}
        self._store_attributes: dict[tuple[str, str], dict[str, Any]] = {}
        self._commit_attributes: dict[str, Any] = {}
        self._queue_depth: Callable[[], int] | None = None
        self._published: Published | None = None
        # Set by the traced store: how the last store commit call ended, and how many were
        # made, since the engine's commit began.
        self.last_commit: tuple[Outcome, str | None] | None = None
        self.store_commits = 0
        self.store: Any = _traced_store(store, self)

    # Lifetime ---------------------------------------------------------------------------------

    def opened(self, queue_depth: Callable[[], int], published: Published) -> None:
        """The actor exists: count it open, and let the gauges read its queue and readers."""
        self._queue_depth = queue_depth
        self._published = published
        self.instruments.open[id(self)] = self
        self.instruments.sessions.add(1, self.metric_attributes)

    def closed(self) -> None:
        """The actor has stopped (idempotent; nothing if it never opened)."""
        if self.instruments.open.pop(id(self), None) is not None:
            self.instruments.sessions.add(-1, self.metric_attributes)

    def detached(
        self, run: Callable[..., Awaitable[None]]
    ) -> Callable[..., Coroutine[Any, Any, None]]:
        """``run`` (the actor's task) with no current span: its commits and compactions start
        traces of their own, not children of whatever span was current at open (one batch
        serves many callers, and the open call's span ends long before the session does)."""
        context = self.instruments.api.context

        async def detached_run(
            *, task_status: anyio.abc.TaskStatus[None] = anyio.TASK_STATUS_IGNORED
        ) -> None:
            token = context.attach(context.Context())
            try:
                await run(task_status=task_status)
            finally:
                context.detach(token)

        return detached_run

    # Gauges -----------------------------------------------------------------------------------

    def queue_depth(self) -> int:
        """Requests waiting in the actor's queue now."""
        return 0 if self._queue_depth is None else self._queue_depth()

    def lag(self) -> int:
        """Committed events the furthest-behind open subscription has not yet read."""
        published = self._published
        if published is None:
            return 0
        count = published.log.count
        cursors = [reader.cursor for reader in list(published.readers)]
        return max(0, count - min(cursors)) if cursors else 0

    # Commits ----------------------------------------------------------------------------------

    def traced_commit(
        self, commit: Callable[[list[Request[Any]]], Awaitable[None]], state: SessionState
    ) -> Callable[[list[Request[Any]]], Awaitable[None]]:
        """The engine's commit of one segment, in a ``nous_session.commit`` span, timed."""
        instruments = self.instruments
        api = instruments.api
        tracer = instruments.tracer
        use_span = api.trace.use_span
        error_status = api.trace.Status(api.trace.StatusCode.ERROR)

        async def traced(requests: list[Request[Any]]) -> None:
            if not requests:
                await commit(requests)  # nothing to commit: no span
                return
            batches = state.batches
            self._forget_store_commits()
            attributes = dict(self.span_attributes)
            attributes[BATCH_SIZE] = len(requests)
            span = tracer.start_span("nous_session.commit", attributes=attributes)
            started = time.perf_counter()
            outcome: Outcome = "error"
            error_type: str | None = None
            try:
                with use_span(span, record_exception=False, set_status_on_exception=False):
                    await commit(requests)
            except BaseException as error:
                if isinstance(error, Exception):
                    error_type = type(error).__qualname__
                    span.record_exception(error)
                else:
                    outcome = "cancelled"
                raise
            else:
                last = self.last_commit
                if state.batches != batches:
                    outcome = "committed"
                elif last is None:
                    outcome = "no_op"  # every request was invalid, or answered by its key
                else:
                    outcome, error_type = last
            finally:
                elapsed = time.perf_counter() - started
                span.set_attribute(OUTCOME, outcome)
                if self.store_commits:
                    span.set_attribute(ATTEMPTS, self.store_commits)
                if error_type is not None:
                    span.set_attribute(ERROR_TYPE, error_type)
                    span.set_status(error_status)
                span.end()
                instruments.batch_size.record(len(requests), self.metric_attributes)
                instruments.commit_duration.record(elapsed, self._outcome(outcome))

        return traced

    def _forget_store_commits(self) -> None:
        self.last_commit = None
        self.store_commits = 0

    def _outcome(self, outcome: Outcome) -> dict[str, Any]:
        attributes = self._outcome_attributes.get(outcome)
        if attributes is None:
            attributes = self._outcome_attributes[outcome] = {
                **self.metric_attributes,
                OUTCOME: outcome,
            }
        return attributes

    # Compaction -------------------------------------------------------------------------------

    def compaction_started(self, surface: int, tokens: int) -> tuple[Span, float]:
        """A compaction begins over a surface of ``surface`` entries (``tokens`` counted)."""
        attributes = dict(self.span_attributes)
        attributes["nous_session.compaction.surface"] = surface
        if tokens:
            attributes["nous_session.compaction.tokens"] = tokens
        # A trace of its own: not a child of the commit that happened to trigger it.
        span = self.instruments.tracer.start_span(
            "nous_session.compaction",
            context=self.instruments.api.context.Context(),
            attributes=attributes,
        )
        return span, time.perf_counter()

    def compaction_finished(self, started: tuple[Span, float], outcome: str) -> None:
        """The compaction ``compaction_started`` began has ended with ``outcome`` (the
        runner's word: applied, stale, nothing, failed, cancelled, ...)."""
        span, began = started
        instruments = self.instruments
        span.set_attribute(COMPACTION_OUTCOME, outcome)
        if outcome == "failed":
            span.set_status(instruments.api.trace.Status(instruments.api.trace.StatusCode.ERROR))
        span.end()
        instruments.compaction_duration.record(
            time.perf_counter() - began, {**self.metric_attributes, COMPACTION_OUTCOME: outcome}
        )

    # Store calls ------------------------------------------------------------------------------

    async def store_call(
        self, operation: str, call: Callable[..., Awaitable[Any]], args: Any, kwargs: Any
    ) -> Any:
        """One store call, in a ``nous_session.store.<operation>`` span, timed."""
        instruments = self.instruments
        api = instruments.api
        attributes = dict(self.span_attributes)
        attributes[OPERATION] = operation
        commit = operation in COMMITS
        if commit:
            self.store_commits += 1
            events = kwargs.get("events")
            if isinstance(events, Sequence):
                attributes[EVENTS] = len(events)
        span = instruments.tracer.start_span(
            f"nous_session.store.{operation}", attributes=attributes
        )
        started = time.perf_counter()
        outcome: Outcome = "error"
        try:
            with api.trace.use_span(span, record_exception=False, set_status_on_exception=False):
                result = await call(*args, **kwargs)
        except Exception as error:
            outcome = _error_outcome(error)
            name = type(error).__qualname__
            span.record_exception(error)
            span.set_attribute(ERROR_TYPE, name)
            span.set_status(api.trace.Status(api.trace.StatusCode.ERROR, f"{name}: {error}"))
            if commit:
                self.last_commit = (outcome, name)
            raise
        except BaseException:
            outcome = "cancelled"
            raise
        else:
            outcome = "committed" if commit else "ok"
            if commit:
                self.last_commit = ("committed", None)
            return result
        finally:
            span.end()
            instruments.store_duration.record(
                time.perf_counter() - started, self._store_metric_attributes(operation, outcome)
            )

    def _store_metric_attributes(self, operation: str, outcome: Outcome) -> dict[str, Any]:
        key = (operation, outcome)
        attributes = self._store_attributes.get(key)
        if attributes is None:
            attributes = self._store_attributes[key] = {
                **self.metric_attributes,
                OPERATION: operation,
                "nous_session.store.outcome": outcome,
            }
        return attributes


def _error_outcome(error: BaseException) -> Outcome:
    if isinstance(error, OutcomeUnknownError):
        return "unknown"
    if isinstance(error, ConflictError):
        return "conflict"
    return "store_error"


# The traced store -----------------------------------------------------------------------------


class _TracedStore:
    """The base of the store proxies :func:`_traced_store` makes."""

    __slots__ = ("_inner", "_telemetry")

    _inner: Any
    _telemetry: SessionTelemetry

    def __getattr__(self, name: str) -> Any:
        # Instance attributes of the store (its path, its statistics, ...) pass through.
        if name in _TracedStore.__slots__:
            raise AttributeError(name)  # not set yet (a copy, say): no endless recursion
        return getattr(self._inner, name)

    def __repr__(self) -> str:
        return f"<traced {self._inner!r}>"


def unwrap_store(store: Any) -> Any:
    """The store a traced store proxy stands for (any other store as it is)."""
    return store._inner if isinstance(store, _TracedStore) else store


_proxies: dict[type, type[_TracedStore]] = {}


def _traced_store(store: object, telemetry: SessionTelemetry) -> _TracedStore:
    """A proxy of ``store`` whose calls the actor makes are traced.

    Its class has exactly the public methods and class attributes of the store's class, so
    :func:`~nous_session.stores.base.supports` finds the same capabilities on it (it looks on
    the class, not the instance).
    """
    cls = type(store)
    proxy_class = _proxies.get(cls)
    if proxy_class is None:
        proxy_class = _proxies[cls] = _proxy_class(cls)
    proxy = object.__new__(proxy_class)
    proxy._inner = store
    proxy._telemetry = telemetry
    return proxy


def _proxy_class(cls: type) -> type[_TracedStore]:
    namespace: dict[str, Any] = {"__slots__": (), "__module__": __name__}
    for name in dir(cls):
        if name.startswith("_"):
            continue
        static = inspect.getattr_static(cls, name)
        if isinstance(static, property):
            namespace[name] = _passthrough_property(name)
        elif callable(getattr(cls, name, None)):
            namespace[name] = _traced_method(name) if name in TRACED else _passthrough(name)
        else:
            namespace[name] = static  # class constants (outcome_may_be_unknown, say)
    return type(f"Traced{cls.__name__}", (_TracedStore,), namespace)


def _traced_method(name: str) -> Callable[..., Awaitable[Any]]:
    async def method(self: _TracedStore, *args: Any, **kwargs: Any) -> Any:
        return await self._telemetry.store_call(name, getattr(self._inner, name), args, kwargs)

    method.__name__ = method.__qualname__ = name
    return method


def _passthrough(name: str) -> Callable[..., Any]:
    def method(self: _TracedStore, *args: Any, **kwargs: Any) -> Any:
        return getattr(self._inner, name)(*args, **kwargs)

    method.__name__ = method.__qualname__ = name
    return method


def _passthrough_property(name: str) -> property:
    return property(lambda self: getattr(self._inner, name))
