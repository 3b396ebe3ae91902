"""How nous_session logs: structlog events that go where the application routes them.

A library is silent unless its application says otherwise. So:

* If the application has configured structlog (``structlog.configure``), events go through
  its configuration, as structured events: ``structlog.get_logger("nous_session")``.
* Otherwise they go to the standard library's :mod:`logging`, to the logger
  ``nous_session`` (and children), rendered as one ``key=value`` line. An application that
  configured nothing sees at most warnings, on stderr (logging's last-resort handler), and
  never anything on stdout; ``logging.basicConfig(level=logging.INFO)`` or a handler on the
  ``nous_session`` logger shows more.

The choice is made the first time a module's logger is used (or bound), not when it is made
at import, so an application may configure logging after importing nous_session.
"""

from __future__ import annotations

import functools
import logging
import time
from typing import Any

import structlog

__all__ = ["Throttle", "get_logger", "wants_debug"]

_NAME = "nous_session"


@functools.cache
def _stdlib(name: str) -> Any:
    """The standard-library route's logger of ``name``: made once per name (its renderer
    takes a while to set up, and every actor that opens binds one)."""
    return structlog.wrap_logger(
        logging.getLogger(name),
        processors=[
            structlog.stdlib.filter_by_level,
            structlog.processors.format_exc_info,
            structlog.processors.KeyValueRenderer(key_order=["event"], sort_keys=True),
        ],
        wrapper_class=structlog.stdlib.BoundLogger,
        context_class=dict,
        cache_logger_on_first_use=True,
    )


def _resolve(name: str) -> Any:
    if structlog.is_configured():
        return structlog.get_logger(name)
    return _stdlib(name)


class _LazyLogger:
    """A bound logger decided at first use (see the module docstring)."""

    __slots__ = ("_bound", "_context", "_name")

    def __init__(self, name: str, context: dict[str, Any]) -> None:
        self._name = name
        self._context = context
        self._bound: Any = None

    def bind(self, **context: Any) -> Any:
        """A bound logger with more context, decided now: binding happens at run time (an
        actor binds its session id when it opens), after the application has set up logging,
        and the bound logger is then called directly (no lookup through this proxy)."""
        return _resolve(self._name).bind(**self._context, **context)

    def __getattr__(self, name: str) -> Any:
        bound = self._bound
        if bound is None:
            bound = self._bound = _resolve(self._name).bind(**self._context)
        return getattr(bound, name)


def get_logger(name: str = _NAME) -> Any:
    """The library's logger (a structlog bound logger, decided at first use)."""
    return _LazyLogger(name, {})


def wants_debug() -> bool:
    """Whether debug events would go anywhere: structlog is configured (it filters), or the
    standard library's ``nous_session`` logger is enabled for DEBUG. Per-commit events are
    logged only then, since rendering one costs more than the commit."""
    return structlog.is_configured() or logging.getLogger(_NAME).isEnabledFor(logging.DEBUG)


class Throttle:
    """When a background failure that repeats may warn: the first time at once, then at most
    once per ``every`` seconds, with how many happened since the last warning.

    A failure handed to a caller is the caller's to report; one that no caller sees (a
    summarizer that fails at every commit, say) must reach the operator without flooding the
    log.
    """

    __slots__ = ("_every", "_next", "_since")

    def __init__(self, every: float = 60.0) -> None:
        self._every = every
        self._next = float("-inf")
        self._since = 0

    def due(self) -> int | None:
        """Count one failure; the number to report if a warning is due now, else None."""
        self._since += 1
        now = time.monotonic()
        if now < self._next:
            return None
        self._next = now + self._every
        count, self._since = self._since, 0
        return count
