"""What telemetry reports with: the OpenTelemetry API (imported once), the attribute and
outcome names, and the instruments made for a pair of providers.

See :mod:`nous_session.telemetry`.
"""

from __future__ import annotations

import functools
import importlib
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any, Final, Literal, Protocol, TypeAlias

if TYPE_CHECKING:
    from opentelemetry.metrics import CallbackOptions, MeterProvider, Observation
    from opentelemetry.trace import TracerProvider


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

# The outcome of a commit or a store call (mypy checks every value written against it): a
# store call that is not a commit succeeds as "ok".
Outcome: TypeAlias = Literal[
    "committed", "conflict", "store_error", "unknown", "no_op", "error", "cancelled", "ok"
]

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
TRACED: Final = frozenset(
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
COMMITS: Final = frozenset({"commit", "commit_rebased"})


class Api:
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


class Observed(Protocol):
    """What the gauges read of an open session's telemetry (``_telemetry_session.py``, which
    imports this module: named here by what it gives)."""

    per_session: bool
    kind: str
    metric_attributes: Any

    def queue_depth(self) -> int: ...

    def lag(self) -> int: ...


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
        api: Api,
        tracer_provider: TracerProvider,
        meter_provider: MeterProvider,
    ) -> None:
        version = _version()
        self.api = api
        self.tracer = tracer_provider.get_tracer(SCOPE, version)
        meter = meter_provider.get_meter(SCOPE, version)
        # Every duration is in seconds, with the same buckets.
        duration = functools.partial(
            meter.create_histogram, unit="s", explicit_bucket_boundaries_advisory=_DURATION_BUCKETS
        )
        self.commit_duration = duration(
            "nous_session.commit.duration",
            description="Time to commit one batch segment, from applying it to answering it.",
        )
        self.batch_size = meter.create_histogram(
            "nous_session.commit.batch.size",
            unit="{request}",
            description="Requests in one committed batch segment.",
            explicit_bucket_boundaries_advisory=_SIZE_BUCKETS,
        )
        self.compaction_duration = duration(
            "nous_session.compaction.duration",
            description="Time one background compaction took, by outcome.",
        )
        self.store_duration = duration(
            "nous_session.store.duration", description="Time one store call took, by operation."
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
        self.open: dict[int, Observed] = {}

    def _observe_queues(self, _options: CallbackOptions) -> Iterable[Observation]:
        return self._observe(lambda session: session.queue_depth(), sum)

    def _observe_lag(self, _options: CallbackOptions) -> Iterable[Observation]:
        return self._observe(lambda session: session.lag(), max)

    def _observe(
        self, value: Callable[[Observed], int], combine: Callable[[list[int]], int]
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
