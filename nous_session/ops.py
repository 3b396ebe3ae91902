"""Surface operations: the typed values that change the surface other than by growing it.

An event may carry one operation (``event.op``); it is stored in the event's data as a JSON
list under ``"surface_op"`` (``["replace", start, stop]``) and parsed once, when the event is
made or decoded. This module defines every operation: its fields, its JSON form and the checks
that do not need the log (``parse_op``). What each one does to the surface is the fold's
business (:mod:`nous_session.log`), which dispatches on these types.

Positions are the surface coordinates of :mod:`nous_session.log`: an event sits at its seq,
or at ``start`` when it carries a :class:`Replace`.
"""

from __future__ import annotations

from typing import ClassVar, Final, TypeAlias

import attrs

from nous_session._json import JSON

__all__ = ["OP_KEY", "Replace", "SurfaceOp", "parse_op"]

OP_KEY: Final = "surface_op"
"""The data key an operation is stored under."""

_INT_MAX: Final = 2**63 - 1


class OpError(ValueError):
    """A surface operation is malformed; the message says why (the caller names the event)."""


def _non_negative_int(_instance: object, attribute: attrs.Attribute[int], value: object) -> None:
    if type(value) is not int:
        raise ValueError(f"Replace.{attribute.name} must be an int, not {type(value).__name__}")
    if value < 0:
        raise ValueError(f"Replace.{attribute.name} must be >= 0, got {value}")


@attrs.frozen
class Replace:
    """Put the event in place of the positions ``start..stop`` (inclusive).

    Raises:
        ValueError: ``start`` or ``stop`` is not an int, is negative, or ``start > stop``.
    """

    start: int = attrs.field(validator=_non_negative_int)
    stop: int = attrs.field(validator=_non_negative_int)

    name: ClassVar[str] = "replace"

    def __attrs_post_init__(self) -> None:
        if self.start > self.stop:
            raise ValueError(f"Replace start {self.start} is after stop {self.stop}")

    @property
    def position(self) -> int:
        """Where the event carrying it sits on the surface."""
        return self.start

    def to_json(self) -> list[JSON]:
        """The form stored in event data: ``["replace", start, stop]``."""
        return ["replace", self.start, self.stop]

    def check_seq(self, seq: int) -> None:
        """Refuse what the event's own seq rules out: a replace reaches only backwards.

        Raises:
            OpError: ``start`` is not below ``seq``.
        """
        if self.start >= seq:
            raise OpError(
                f"surface_op replaces from position {self.start}, which is not below the"
                " event's own seq"
            )


SurfaceOp: TypeAlias = Replace
"""Every surface operation."""


def _replace(value: list[object]) -> Replace:
    if len(value) != 3:
        raise OpError(f'malformed surface_op {value!r}: a replace is ["replace", start, stop]')
    _, start, stop = value
    if type(start) is not int or type(stop) is not int:
        raise OpError(f"malformed surface_op {value!r}: start and stop must be ints")
    if stop > _INT_MAX:
        raise OpError(f"malformed surface_op {value!r}: stop is beyond 64 bits")
    if start < 0 or start > stop:
        raise OpError(f"malformed surface_op {value!r}: needs 0 <= start <= stop")
    return Replace(start, stop)


_PARSERS: Final = {"replace": _replace}


def parse_op(value: object) -> SurfaceOp:
    """The operation a stored ``surface_op`` value (or an operation value itself) stands for.

    Raises:
        OpError: ``value`` is not a well-formed operation.
    """
    if isinstance(value, Replace):
        return value
    if isinstance(value, list | tuple) and type(value) in (list, tuple) and value:
        parser = _PARSERS.get(value[0]) if type(value[0]) is str else None
        if parser is not None:
            return parser(list(value))
    known = ", ".join(f'["{name}", ...]' for name in _PARSERS)
    raise OpError(f"malformed surface_op {value!r}: the operations are {known}")
