"""Surface operations: the typed values that change the surface other than by growing it.

An event may carry one operation (``event.op``); it is stored in the event's data as a JSON
list under ``"surface_op"`` and parsed once, when the event is made or decoded. This module
defines every operation: its fields, its JSON form, and the checks that need only the event's
own seq (:func:`parse_op`, ``check_seq``). What each one does to the surface is the fold's
business (:mod:`nous_session.log`), which dispatches on these types, and the checks that need
the log (is the summary to un-compact still on the surface?) are the Log's.

The operations, with the event types that carry them:

===============================  =====================  =====================================
operation                        carried by             effect on the surface
===============================  =====================  =====================================
``["replace", start, stop]``     a surface event        the event's message in place of the
                                                        positions ``start..stop``
``["replace", start, stop]``     ``replace``            its ``messages`` (k >= 0) in place of
                                                        ``start..stop``
``["remove", start, stop]``      ``remove``             ``start..stop`` disappear
``["rewind", to]``               ``rewind``             the surface as it was at seq ``to``
``["uncompact", seq]``           ``uncompact``          the replace at ``seq`` undone: the
                                                        range it replaced is visible again
===============================  =====================  =====================================

Positions are the surface coordinates of :mod:`nous_session.log`: an event sits at its seq,
or at ``start`` when it carries a range operation; every message a ``replace`` event holds sits
at its ``start``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import ClassVar, Final, TypeAlias

import attrs

from nous_session._json import JSON

__all__ = ["OP_KEY", "Remove", "Replace", "Rewind", "SurfaceOp", "Uncompact", "parse_op"]

OP_KEY: Final = "surface_op"
"""The data key an operation is stored under."""

_INT_MAX: Final = 2**63 - 1


class OpError(ValueError):
    """A surface operation is malformed; the message says why (the caller names the event)."""


def _int_at_least(low: int) -> Callable[[object, attrs.Attribute[int], object], None]:
    def check(instance: object, attribute: attrs.Attribute[int], value: object) -> None:
        where = f"{type(instance).__name__}.{attribute.name}"
        if type(value) is not int:
            raise ValueError(f"{where} must be an int, not {type(value).__name__}")
        if not low <= value <= _INT_MAX:
            raise ValueError(f"{where} must be in {low}..2**63-1, got {value}")

    return check


@attrs.frozen
class _Range:
    """An operation over the positions ``start..stop`` (inclusive)."""

    start: int = attrs.field(validator=_int_at_least(0))
    stop: int = attrs.field(validator=_int_at_least(0))

    name: ClassVar[str] = ""

    def __attrs_post_init__(self) -> None:
        if self.start > self.stop:
            raise ValueError(f"{type(self).__name__} start {self.start} is after stop {self.stop}")

    @property
    def position(self) -> int:
        """Where the event carrying it sits on the surface: ``start``."""
        return self.start

    def to_json(self) -> list[JSON]:
        """The form stored in event data: ``[name, start, stop]``."""
        return [self.name, self.start, self.stop]

    def check_seq(self, seq: int) -> None:
        """Refuse what the event's own seq rules out: a range operation reaches backwards.

        Raises:
            OpError: ``start`` is not below ``seq``.
        """
        if self.start >= seq:
            verb = "replaces" if self.name == "replace" else "removes"
            raise OpError(
                f"surface_op {verb} from position {self.start}, which is not below the"
                " event's own seq"
            )


@attrs.frozen
class Replace(_Range):
    """Put the event's message(s) in place of the positions ``start..stop`` (inclusive).

    Raises:
        ValueError: ``start`` or ``stop`` is not an int, is negative, or ``start > stop``.
    """

    name: ClassVar[str] = "replace"


@attrs.frozen
class Remove(_Range):
    """Take the positions ``start..stop`` (inclusive) off the surface; nothing takes their place.

    Raises:
        ValueError: ``start`` or ``stop`` is not an int, is negative, or ``start > stop``.
    """

    name: ClassVar[str] = "remove"


@attrs.frozen
class Rewind:
    """Make the surface what it was when seq ``to`` was the newest event (-1: empty).

    Later history stays in the log; another rewind can bring it back.

    Raises:
        ValueError: ``to`` is not an int >= -1.
    """

    to: int = attrs.field(validator=_int_at_least(-1))

    name: ClassVar[str] = "rewind"

    def to_json(self) -> list[JSON]:
        """The form stored in event data: ``["rewind", to]``."""
        return ["rewind", self.to]

    def check_seq(self, seq: int) -> None:
        """Refuse a rewind that does not reach back.

        Raises:
            OpError: ``to`` is not below ``seq``.
        """
        if self.to >= seq:
            raise OpError(f"surface_op rewinds to seq {self.to}, which is not below its own seq")


@attrs.frozen
class Uncompact:
    """Undo the replace at ``seq``: the range it replaced is visible again, as it was then.

    Raises:
        ValueError: ``seq`` is not an int >= 0.
    """

    seq: int = attrs.field(validator=_int_at_least(0))

    name: ClassVar[str] = "uncompact"

    def to_json(self) -> list[JSON]:
        """The form stored in event data: ``["uncompact", seq]``."""
        return ["uncompact", self.seq]

    def check_seq(self, seq: int) -> None:
        """Refuse an uncompact that does not reach back.

        Raises:
            OpError: the replace's seq is not below ``seq``.
        """
        if self.seq >= seq:
            raise OpError(
                f"surface_op uncompacts seq {self.seq}, which is not below the event's own seq"
            )


SurfaceOp: TypeAlias = Replace | Remove | Rewind | Uncompact
"""Every surface operation."""

RANGE_OPS: Final = (Replace, Remove)
"""The operations over a range of positions."""


def _ints(value: list[object], size: int, form: str) -> list[int]:
    if len(value) != size:
        raise OpError(f"malformed surface_op {value!r}: {form}")
    numbers = [number for number in value[1:] if type(number) is int]  # no bool
    if len(numbers) != size - 1:
        raise OpError(f"malformed surface_op {value!r}: {form} takes ints")
    if any(number > _INT_MAX for number in numbers):
        raise OpError(f"malformed surface_op {value!r}: beyond 64 bits")
    return numbers


def _range(kind: type[Replace] | type[Remove]) -> Callable[[list[object]], SurfaceOp]:
    form = f'["{kind.name}", start, stop]'

    def parse(value: list[object]) -> SurfaceOp:
        start, stop = _ints(value, 3, form)
        if start < 0 or start > stop:
            raise OpError(f"malformed surface_op {value!r}: needs 0 <= start <= stop")
        return kind(start, stop)

    return parse


def _rewind(value: list[object]) -> SurfaceOp:
    (to,) = _ints(value, 2, '["rewind", to]')
    if to < -1:
        raise OpError(f"malformed surface_op {value!r}: needs to >= -1")
    return Rewind(to)


def _uncompact(value: list[object]) -> SurfaceOp:
    (seq,) = _ints(value, 2, '["uncompact", seq]')
    if seq < 0:
        raise OpError(f"malformed surface_op {value!r}: needs seq >= 0")
    return Uncompact(seq)


_PARSERS: Final[dict[str, Callable[[list[object]], SurfaceOp]]] = {
    "replace": _range(Replace),
    "remove": _range(Remove),
    "rewind": _rewind,
    "uncompact": _uncompact,
}


def parse_op(value: object) -> SurfaceOp:
    """The operation a stored ``surface_op`` value (or an operation value itself) stands for.

    Raises:
        OpError: ``value`` is not a well-formed operation.
    """
    if isinstance(value, Replace | Remove | Rewind | Uncompact):
        return value
    if (type(value) is list or type(value) is tuple) and value:  # not a subclass
        head = value[0]
        parser = _PARSERS.get(head) if type(head) is str else None
        if parser is not None:
            return parser(list(value))
    known = ", ".join(f'["{name}", ...]' for name in _PARSERS)
    raise OpError(f"malformed surface_op {value!r}: the operations are {known}")
