"""OpenTelemetry traces and metrics for session actors, at no cost when they are off.

Install the ``otel`` extra (``pip install 'nous_session[otel]'``: opentelemetry-api only; the
application brings the SDK and its exporters). Then every :class:`~nous_session.SessionActor`
opened while telemetry is *active* reports:

* spans ``nous_session.commit`` (one per store commit of a batch segment),
  ``nous_session.compaction`` (one per background compaction) and
  ``nous_session.store.<operation>`` (each call the actor makes to its store: ``read``,
  ``load``, ``commit``, ``commit_rebased``, ``committed``, ...);
* metrics ``nous_session.commit.duration``, ``nous_session.commit.batch.size``,
  ``nous_session.compaction.duration``, ``nous_session.store.duration`` (histograms),
  ``nous_session.session.count`` (an up-down counter of open sessions),
  ``nous_session.queue.depth`` and ``nous_session.subscription.lag`` (observable gauges).

All under the instrumentation scope ``nous_session`` with the package's version.

When telemetry is active
------------------------
Decided once per actor, when it opens (:func:`session`), and fixed for its lifetime:

* after :func:`enable`: always (with the providers given, else OpenTelemetry's global ones,
  which may be set later: the API's proxies forward to them once they are);
* after :func:`disable`: never;
* otherwise (the default, *automatic*): when opentelemetry-api is importable **and** the
  application has set a global tracer provider or meter provider (``trace.set_tracer_provider``,
  ``metrics.set_meter_provider`` or the ``OTEL_PYTHON_*_PROVIDER`` variables). A provider set
  after some actors opened instruments the actors opened after it.

Whether the API is importable is found out once per process (:func:`reset` forgets it).

What it costs when off
----------------------
An actor opened while telemetry is not active holds no telemetry object at all: its engine
binds the plain commit method at construction and its store is not wrapped, so an append runs
exactly the code it runs without this module (no check, no call). The only cost is at open:
one look at OpenTelemetry's global providers (nothing when the API is not installed).
``benchmarks/suites/telemetry.py`` measures it.
"""

from __future__ import annotations

import enum
import importlib
import inspect
import time
from collections.abc import Awaitable, Callable, Coroutine, Iterable, Sequence
from typing import TYPE_CHECKING, Any, Final, Literal

import anyio
import anyio.abc

from nous_session.errors import ConflictError, OutcomeUnknownError

if TYPE_CHECKING:
    from opentelemetry.metrics import CallbackOptions, MeterProvider, Observation
    from opentelemetry.trace import Span, TracerProvider

    from nous_session._requests import Request
    from nous_session._state import SessionState
    from nous_session.subscription import Published

__all__ = ["SCOPE", "active", "disable", "enable", "reset"]

SCOPE: Final = "nous_session"
"""The instrumentation scope's name (its version is the package's)."""

# Attribute names (OpenTelemetry's naming style: the library's namespace, dotted, snake_case).
SESSION_ID: Final = "nous_session.session.id"
STORE_KIND: Final = "nous_session.store.kind"
OPERATION: Final = "nous_session.store.operation"
BATCH_SIZE: Final = "nous_session.commit.batch.size"
EVENTS: Final = "nous_session.commit.events"
ATTEMPTS: Final = "nous_session.commit.attempts"
OUTCOME: Final = "nous_session.commit.outcome"
COMPACTION_OUTCOME: Final = "nous_session.compaction.outcome"
ERROR_TYPE: Final = "error.type"

# Commit outcomes.
COMMITTED: Final = "committed"
CONFLICT: Final = "conflict"
STORE_ERROR: Final = "store_error"
UNKNOWN: Final = "unknown"
NO_OP: Final = "no_op"
ERROR: Final = "error"
CANCELLED: Final = "cancelled"

_DURATION_BUCKETS: Final = (
    0.0001,
    0.00025,
    0.0005,
    0.001,
    0.0025,
    0.005,
    0.01,
    0.025,
    0.05,
    0.1,
    0.25,
    0.5,
    1.0,
    2.5,
    5.0,
    10.0,
    30.0,
)
_SIZE_BUCKETS: Final = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096)

# The store calls that get a span; every other public attribute passes through untouched.
_TRACED: Final = frozenset(
    {
        "load",
        "read",
        "commit",
        "commit_rebased",
        "committed",
        "sessions",
        "delete",
        "fork",
        "vacuum",
    }
)
_COMMITS: Final = frozenset({"commit", "commit_rebased"})


class _Unresolved(enum.Enum):
    """The type of _UNRESOLVED: an enum of one, so that ``is _UNRESOLVED`` narrows."""

    TOKEN = "unresolved"


_UNRESOLVED: Final = _Unresolved.TOKEN


class _Api:
    """The parts of opentelemetry-api this module uses, imported once."""

    __slots__ = ("context", "metrics", "no_op_meters", "no_op_tracers", "trace")

    def __init__(self) -> None:
        self.trace = importlib.import_module("opentelemetry.trace")
        self.metrics = importlib.import_module("opentelemetry.metrics")
        self.context = importlib.import_module("opentelemetry.context")
        # Until the application sets one, the global providers are proxies (or no-ops).
        self.no_op_tracers: tuple[type, ...] = (
            self.trace.ProxyTracerProvider,
            self.trace.NoOpTracerProvider,
        )
        internal = importlib.import_module("opentelemetry.metrics._internal")
        proxy = getattr(internal, "_ProxyMeterProvider", None)
        self.no_op_meters: tuple[type, ...] = (self.metrics.NoOpMeterProvider,) + (
            (proxy,) if isinstance(proxy, type) else ()
        )


class _Settings:
    """The module's state: what :func:`enable`/:func:`disable` chose, and what was resolved."""

    __slots__ = ("api", "explicit", "made", "mode")

    def __init__(self) -> None:
        self.mode: Literal["auto", "on", "off"] = "auto"
        self.api: _Api | _Unresolved | None = _UNRESOLVED  # None: opentelemetry-api is missing
        self.explicit: tuple[Instruments, bool] | None = None  # enable()'s, and per_session
        # The instruments made for each pair of providers, with the providers (kept alive, so
        # their ids stay theirs). Made once per pair: a meter keeps the first callbacks of an
        # observable gauge of a given name, so gauges made again would observe nothing.
        self.made: dict[tuple[int, int], tuple[object, object, Instruments]] = {}


_settings = _Settings()


def _api() -> _Api | None:
    """opentelemetry-api, imported at the first need; None (remembered) when it is missing."""
    api = _settings.api
    if api is _UNRESOLVED:
        try:
            api = _Api()
        except ImportError:
            api = None
        _settings.api = api
    return api


def enable(
    *,
    tracer_provider: TracerProvider | None = None,
    meter_provider: MeterProvider | None = None,
    per_session: bool = False,
) -> None:
    """Instrument every session actor opened from now on.

    Args:
        tracer_provider: where spans go; None means OpenTelemetry's global provider (which
            may be set later: the API forwards to it once it is).
        meter_provider: where metrics go; None means the global one, likewise.
        per_session: give the metrics of the sessions opened from now on the attribute
            ``nous_session.session.id``: one series per session (the queue-depth and
            subscription-lag gauges included) instead of one per store kind. Spans always
            carry the session id; metrics do only with this, because a process may hold many
            thousands of sessions.

    Raises:
        ImportError: opentelemetry-api is not installed (install ``nous_session[otel]``).
        ValueError: a provider is not an OpenTelemetry provider, or ``per_session`` is not
            a bool (nothing changes).
    """
    api = _api()
    if api is None:
        raise ImportError(
            "nous_session.telemetry.enable() needs opentelemetry-api: "
            "pip install 'nous_session[otel]'"
        )
    if tracer_provider is not None and not isinstance(tracer_provider, api.trace.TracerProvider):
        raise ValueError(
            f"tracer_provider must be an opentelemetry TracerProvider, got {tracer_provider!r}"
        )
    if meter_provider is not None and not isinstance(meter_provider, api.metrics.MeterProvider):
        raise ValueError(
            f"meter_provider must be an opentelemetry MeterProvider, got {meter_provider!r}"
        )
    if not isinstance(per_session, bool):
        raise ValueError(f"per_session must be a bool, got {per_session!r}")
    instruments = _made(
        api,
        tracer_provider if tracer_provider is not None else api.trace.get_tracer_provider(),
        meter_provider if meter_provider is not None else api.metrics.get_meter_provider(),
    )
    _settings.explicit = (instruments, per_session)
    _settings.mode = "on"


def disable() -> None:
    """Instrument no session actor opened from now on (those already open keep reporting
    until they close)."""
    _settings.mode = "off"
    _settings.explicit = None


def reset() -> None:
    """Back to the default, automatic choice (see the module docstring), and find out again
    whether opentelemetry-api is importable."""
    _settings.mode = "auto"
    _settings.explicit = None
    _settings.api = _UNRESOLVED


def active() -> bool:
    """Whether a session actor opened now would be instrumented."""
    return _instruments() is not None


def _made(api: _Api, tracers: TracerProvider, meters: MeterProvider) -> Instruments:
    """The instruments for this pair of providers (made at the first need)."""
    key = (id(tracers), id(meters))
    made = _settings.made.get(key)
    if made is None:
        made = _settings.made[key] = (tracers, meters, Instruments(api, tracers, meters))
    return made[2]


def _instruments() -> tuple[Instruments, bool] | None:
    """The instruments an actor opening now reports to and whether per session, or None when
    telemetry is off."""
    mode = _settings.mode
    if mode == "on":
        return _settings.explicit
    if mode == "off":
        return None
    api = _api()
    if api is None:
        return None
    tracers = api.trace.get_tracer_provider()
    meters = api.metrics.get_meter_provider()
    if isinstance(tracers, api.no_op_tracers) and isinstance(meters, api.no_op_meters):
        return None  # nothing would record anything
    return _made(api, tracers, meters), False


def session(session_id: str, store: object) -> SessionTelemetry | None:
    """The telemetry of a session actor about to open, or None when telemetry is off.

    The actor calls this once, in ``SessionActor.open``; None means it runs exactly as if
    this module did not exist.
    """
    chosen = _instruments()
    if chosen is None:
        return None
    instruments, per_session = chosen
    return SessionTelemetry(instruments, session_id, store, per_session=per_session)


def unwrap_store(store: Any) -> Any:
    """The store a traced store proxy stands for (any other store as it is)."""
    return store._inner if isinstance(store, _TracedStore) else store


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("nous_session")
    except PackageNotFoundError:
        return "0+unknown"


def store_kind(store: object) -> str:
    """A store's kind for attributes: ``memory``, ``sqlite``, ``postgres`` for the built-in
    stores, else the store class's qualified name."""
    cls = type(store)
    module = cls.__module__
    if module.startswith("nous_session.stores."):
        return module.rsplit(".", 1)[1]
    return f"{module}.{cls.__qualname__}"


class Instruments:
    """The tracer and the metric instruments for one pair of providers (made once and shared
    by every actor that reports to them), and the open sessions the gauges observe."""

    __slots__ = (
        "api",
        "batch_size",
        "commit_duration",
        "compaction_duration",
        "open",
        "sessions",
        "store_duration",
        "tracer",
    )

    def __init__(
        self,
        api: _Api,
        tracer_provider: TracerProvider,
        meter_provider: MeterProvider,
    ) -> None:
        version = _version()
        self.api = api
        self.tracer = tracer_provider.get_tracer(SCOPE, version)
        meter = meter_provider.get_meter(SCOPE, version)
        self.commit_duration = meter.create_histogram(
            "nous_session.commit.duration",
            unit="s",
            description="Time to commit one batch segment, from applying it to answering it.",
            explicit_bucket_boundaries_advisory=_DURATION_BUCKETS,
        )
        self.batch_size = meter.create_histogram(
            "nous_session.commit.batch.size",
            unit="{request}",
            description="Requests in one committed batch segment.",
            explicit_bucket_boundaries_advisory=_SIZE_BUCKETS,
        )
        self.compaction_duration = meter.create_histogram(
            "nous_session.compaction.duration",
            unit="s",
            description="Time one background compaction took, by outcome.",
            explicit_bucket_boundaries_advisory=_DURATION_BUCKETS,
        )
        self.store_duration = meter.create_histogram(
            "nous_session.store.duration",
            unit="s",
            description="Time one store call took, by operation.",
            explicit_bucket_boundaries_advisory=_DURATION_BUCKETS,
        )
        self.sessions = meter.create_up_down_counter(
            "nous_session.session.count",
            unit="{session}",
            description="Open session actors.",
        )
        meter.create_observable_gauge(
            "nous_session.queue.depth",
            callbacks=[self._observe_queues],
            unit="{request}",
            description="Requests waiting in the actors' queues (summed per store kind).",
        )
        meter.create_observable_gauge(
            "nous_session.subscription.lag",
            callbacks=[self._observe_lag],
            unit="{event}",
            description="Committed events the furthest-behind subscriber has not yet read.",
        )
        # Open sessions, by id(): the gauges' callbacks read them (possibly from an exporter's
        # thread: they only read ints and copy containers).
        self.open: dict[int, SessionTelemetry] = {}

    def _observe_queues(self, _options: CallbackOptions) -> Iterable[Observation]:
        return self._observe(lambda session: session.queue_depth(), sum)

    def _observe_lag(self, _options: CallbackOptions) -> Iterable[Observation]:
        return self._observe(lambda session: session.lag(), max)

    def _observe(
        self, value: Callable[[SessionTelemetry], int], combine: Callable[[list[int]], int]
    ) -> list[Observation]:
        observation = self.api.metrics.Observation
        observed = []
        by_kind: dict[str, list[int]] = {}
        for session in list(self.open.values()):
            if session.per_session:
                observed.append(observation(value(session), session.metric_attributes))
            else:
                by_kind.setdefault(session.kind, []).append(value(session))
        observed.extend(
            observation(combine(values), {STORE_KIND: kind}) for kind, values in by_kind.items()
        )
        return observed


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
        self.last_commit: tuple[str, str | None] | None = None
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
        self, commit: Callable[[list[Request]], Awaitable[None]], state: SessionState
    ) -> Callable[[list[Request]], Awaitable[None]]:
        """The engine's commit of one segment, in a ``nous_session.commit`` span, timed."""
        instruments = self.instruments
        api = instruments.api
        tracer = instruments.tracer
        use_span = api.trace.use_span
        error_status = api.trace.Status(api.trace.StatusCode.ERROR)

        async def traced(requests: list[Request]) -> None:
            if not requests:
                await commit(requests)  # nothing to commit: no span
                return
            batches = state.batches
            self._forget_store_commits()
            attributes = dict(self.span_attributes)
            attributes[BATCH_SIZE] = len(requests)
            span = tracer.start_span("nous_session.commit", attributes=attributes)
            started = time.perf_counter()
            outcome = ERROR
            error_type: str | None = None
            try:
                with use_span(span, record_exception=False, set_status_on_exception=False):
                    await commit(requests)
            except BaseException as error:
                if isinstance(error, Exception):
                    error_type = type(error).__qualname__
                    span.record_exception(error)
                else:
                    outcome = CANCELLED
                raise
            else:
                last = self.last_commit
                if state.batches != batches:
                    outcome = COMMITTED
                elif last is None:
                    outcome = NO_OP  # every request was invalid, or answered by its key
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

    def _outcome(self, outcome: str) -> dict[str, Any]:
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
        commit = operation in _COMMITS
        if commit:
            self.store_commits += 1
            events = kwargs.get("events")
            if isinstance(events, Sequence):
                attributes[EVENTS] = len(events)
        span = instruments.tracer.start_span(
            f"nous_session.store.{operation}", attributes=attributes
        )
        started = time.perf_counter()
        outcome = ERROR
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
            outcome = CANCELLED
            raise
        else:
            outcome = COMMITTED if commit else "ok"
            if commit:
                self.last_commit = (COMMITTED, None)
            return result
        finally:
            span.end()
            instruments.store_duration.record(
                time.perf_counter() - started, self._store_metric_attributes(operation, outcome)
            )

    def _store_metric_attributes(self, operation: str, outcome: str) -> dict[str, Any]:
        key = (operation, outcome)
        attributes = self._store_attributes.get(key)
        if attributes is None:
            attributes = self._store_attributes[key] = {
                **self.metric_attributes,
                OPERATION: operation,
                "nous_session.store.outcome": outcome,
            }
        return attributes


def _error_outcome(error: BaseException) -> str:
    if isinstance(error, OutcomeUnknownError):
        return UNKNOWN
    if isinstance(error, ConflictError):
        return CONFLICT
    return STORE_ERROR


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
            namespace[name] = _traced_method(name) if name in _TRACED else _passthrough(name)
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
