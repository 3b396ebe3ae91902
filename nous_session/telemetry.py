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
from typing import TYPE_CHECKING, Final, Literal

from nous_session._telemetry_instruments import SCOPE, Api, Instruments
from nous_session._telemetry_session import SessionTelemetry as SessionTelemetry  # the actor's type
from nous_session._telemetry_session import unwrap_store as unwrap_store  # the actor's

if TYPE_CHECKING:
    from opentelemetry.metrics import MeterProvider
    from opentelemetry.trace import TracerProvider

__all__ = ["SCOPE", "active", "disable", "enable", "reset"]


class _Unresolved(enum.Enum):
    """The type of _UNRESOLVED: an enum of one, so that ``is _UNRESOLVED`` narrows."""

    TOKEN = "unresolved"


_UNRESOLVED: Final = _Unresolved.TOKEN


class _Settings:
    """The module's state: what :func:`enable`/:func:`disable` chose, and what was resolved."""

    __slots__ = ("api", "explicit", "made", "mode")

    def __init__(self) -> None:
        self.mode: Literal["auto", "on", "off"] = "auto"
        self.api: Api | _Unresolved | None = _UNRESOLVED  # None: opentelemetry-api is missing
        self.explicit: tuple[Instruments, bool] | None = None  # enable()'s, and per_session
        # The instruments made for each pair of providers, with the providers (kept alive, so
        # their ids stay theirs). Made once per pair: a meter keeps the first callbacks of an
        # observable gauge of a given name, so gauges made again would observe nothing.
        self.made: dict[tuple[int, int], tuple[object, object, Instruments]] = {}


_settings = _Settings()


def _api() -> Api | None:
    """opentelemetry-api, imported at the first need; None (remembered) when it is missing."""
    api = _settings.api
    if api is _UNRESOLVED:
        try:
            api = Api()
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


def _made(api: Api, tracers: TracerProvider, meters: MeterProvider) -> Instruments:
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
