"""Validating deep copies of JSON values (shared by messages and events).

The rules: str-keyed dicts (any mapping is accepted and stored as a dict), lists (tuples are
stored as lists), str (valid Unicode: a lone surrogate cannot be encoded, so it is refused here
rather than when a store encodes the batch it is in), int (of any size up to
:data:`MAX_INT_DIGITS` digits), finite float, bool and None. Subclasses of
str, int and float (enums, for instance) are stored as the plain base value, so what is kept is
exactly what a JSON round trip gives back.

:func:`dumps` and :func:`loads` are that round trip. orjson is fast but holds integers to 64
bits (it refuses a wider one on encode and reads one as a float); frameworks' own stores keep
wider ones, so a value holding one goes through the standard library's ``json`` instead. Only
such a value pays for it: everything else stays on orjson.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Callable, Iterable, Mapping
from typing import Any, TypeAlias

import orjson

__all__ = [
    "JSON",
    "MAX_DEPTH",
    "MAX_INT_DIGITS",
    "NotJSONError",
    "check_text",
    "copy_json",
    "copy_json_object",
    "dumps",
    "exact_loads",
    "format_path",
    "holds_wide_number",
    "loads",
    "may_be_wide",
]

JSON: TypeAlias = "dict[str, JSON] | list[JSON] | str | int | float | bool | None"

_INT_MIN = -(2**63)
_INT_MAX = 2**63 - 1
MAX_INT_DIGITS = 4000
"""How many decimal digits an integer may have: inside the 4300 that Python converts between
int and text by default (``sys.get_int_max_str_digits``), so every stored int round-trips."""
_INT_LIMIT = 10**MAX_INT_DIGITS
# orjson writes and reads ints in -2**63..2**64-1 exactly; a float at least this large may be a
# wider int it read approximately.
_WIDE = float(2**63)
# orjson's refusal of a wider int on encode (its other refusals keep their own messages).
_WIDE_INT_ERROR = "Integer exceeds 64-bit range"
# A wide int has at least 19 digits in a row; text without such a run cannot hold one.
_DIGIT_RUN = re.compile(rb"[0-9]{19}")
MAX_DEPTH = 100
"""How deeply containers may nest: far beyond any real payload, well inside what orjson
encodes (254) and what Python's recursion limit allows."""


class NotJSONError(ValueError):
    """A value is not JSON. ``path`` holds the keys and indexes leading to the offender."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason
        # Filled innermost-first while the error unwinds, so the success path builds no paths.
        self.path: list[str | int] = []

    def where(self, root: str) -> str:
        """Render the offender's path below ``root``, for example ``data["a"]["b"][1]``."""
        return root + format_path(reversed(self.path))


def format_path(parts: Iterable[str | int]) -> str:
    """``["a", 1]`` -> ``["a"][1]``; keys are JSON-quoted so odd characters stay readable."""
    out = []
    for part in parts:
        if isinstance(part, int):
            out.append(f"[{part}]")
        else:
            out.append(f"[{orjson.dumps(part).decode()}]")
    return "".join(out)


def _describe(value: object) -> str:
    if isinstance(value, float):
        return f"{value!r} is not a finite number"
    if isinstance(value, int):
        return f"an integer of more than {MAX_INT_DIGITS} digits cannot be stored"
    return f"{type(value).__name__} is not JSON"


def check_text(text: str) -> str:
    """Return ``text`` if it encodes as UTF-8 (ASCII is checked in one fast pass).

    Raises:
        NotJSONError: it holds a lone surrogate, which no store can encode.
    """
    if text.isascii():
        return text
    try:
        text.encode()
    except UnicodeEncodeError as error:
        raise NotJSONError(
            f"a string holds a lone surrogate at index {error.start}"
            f" ({text[error.start]!r}); it is not valid Unicode and cannot be stored"
        ) from None
    return text


def copy_json(value: Any, depth: int = 0) -> JSON:
    """Return a deep, JSON-only copy of ``value``.

    ``value`` is typed Any because the exact-type tests below go through ``t = type(value)``
    (one call, for speed: this runs for every value of every appended event), which mypy does
    not follow; each branch is as narrow as its test.

    Raises:
        NotJSONError: naming the first offender; its ``path`` leads to it.
    """
    t = type(value)
    if t is str:
        return check_text(value)
    if value is None or t is bool:
        return value  # type: ignore[no-any-return]  # None or a bool: t is tested above
    if t is int:
        if _INT_MIN <= value <= _INT_MAX or -_INT_LIMIT < value < _INT_LIMIT:
            return value  # type: ignore[no-any-return]  # an int: t is tested above
        raise NotJSONError(_describe(value))
    if t is float:
        if math.isfinite(value):
            return value  # type: ignore[no-any-return]  # a float: t is tested above
        raise NotJSONError(_describe(value))
    if t is dict or isinstance(value, Mapping):
        return copy_json_object(value, depth)
    if t is list or t is tuple:
        if depth >= MAX_DEPTH:
            raise NotJSONError(f"containers nest deeper than {MAX_DEPTH} levels")
        out: list[JSON] = []
        index = 0
        try:
            items: list[object] = value
            for index, item in enumerate(items):  # noqa: B007
                out.append(copy_json(item, depth + 1))
        except NotJSONError as e:
            e.path.append(index)
            raise
        return out
    # Subclasses of the scalar types (str and int enums, numpy-free float subclasses, ...).
    if isinstance(value, str):
        return check_text(str.__str__(value))
    if isinstance(value, bool):
        return bool(value)
    if isinstance(value, int):
        return copy_json(int(value))
    if isinstance(value, float):
        return copy_json(float(value))
    raise NotJSONError(_describe(value))


def copy_json_object(value: Mapping[Any, Any], depth: int = 0) -> dict[str, JSON]:
    """Return a deep, JSON-only copy of a mapping with string keys.

    Its items are Any for the reason :func:`copy_json`'s value is: exact-type tests.

    Raises:
        NotJSONError: naming the first offender.
    """
    if depth >= MAX_DEPTH:
        raise NotJSONError(f"containers nest deeper than {MAX_DEPTH} levels")
    out: dict[str, JSON] = {}
    for key, item in value.items():
        if type(key) is not str:
            if not isinstance(key, str):
                raise NotJSONError(f"key {key!r} ({type(key).__name__}) is not a string")
            key = str.__str__(key)
        if not key.isascii():
            check_text(key)
        t = type(item)
        # Inline the common scalar cases: this runs for every key of every appended event.
        if (t is str and item.isascii()) or item is None or t is bool:
            out[key] = item
            continue
        try:
            out[key] = copy_json(item, depth + 1)
        except NotJSONError as e:
            e.path.append(key)
            raise
    return out


def dumps(value: object, *, default: Callable[[Any], Any] | None = dict) -> bytes:
    """Compact UTF-8 JSON for a JSON value, exact for integers of any size.

    Args:
        value: what to write.
        default: how to turn what JSON has no type for into something it has, as for
            ``orjson.dumps``; by default a mapping (an event's read-only data) is written as
            the object it is.

    Raises:
        TypeError: ``value`` holds something that cannot be encoded.
    """
    try:
        return orjson.dumps(value, default=default)
    except orjson.JSONEncodeError as error:
        if str(error) != _WIDE_INT_ERROR:
            raise
    # The rare value with an int wider than 64 bits: the standard library writes it exactly.
    return json.dumps(
        value, default=default, ensure_ascii=False, separators=(",", ":"), allow_nan=False
    ).encode()


def loads(text: bytes | bytearray | memoryview | str) -> Any:
    """Parse JSON text, giving back integers of any size exactly.

    Raises:
        ValueError: the text is not JSON (``orjson.JSONDecodeError`` when orjson says so).
    """
    try:
        value = orjson.loads(text)
    except orjson.JSONDecodeError:
        # orjson refuses an int too wide even for a float; the standard library reads it.
        if not may_be_wide(text):
            raise
        return exact_loads(text)
    if may_be_wide(text) and holds_wide_number(value):
        return exact_loads(text)
    return value


def exact_loads(text: bytes | bytearray | memoryview | str) -> Any:
    """Parse JSON text with the standard library: slower than orjson, exact for wide ints.

    As strict as orjson where the two differ: UTF-8 only, no ``NaN`` or ``Infinity``.

    Raises:
        ValueError: the text is not JSON, or holds an int too long to convert.
    """
    if not isinstance(text, str):
        text = bytes(text).decode()  # strict UTF-8 (json.loads would guess UTF-16 or -32)
    try:
        return json.loads(text, parse_constant=_refuse_constant)
    except RecursionError:
        raise ValueError(f"containers nest deeper than {MAX_DEPTH} levels") from None


def holds_wide_number(value: object, depth: int = 0) -> bool:
    """Whether orjson's reading of ``value`` may have turned a wide int into a float: some
    float in it is at least 2**63 in size (every float that large is a whole number)."""
    if type(value) is float:
        return not -_WIDE < value < _WIDE
    if depth > MAX_DEPTH:
        return False
    if type(value) is dict:
        return any(holds_wide_number(item, depth + 1) for item in value.values())
    if type(value) is list:
        return any(holds_wide_number(item, depth + 1) for item in value)
    return False


def may_be_wide(text: bytes | bytearray | memoryview | str) -> bool:
    """Whether JSON text may hold an int wider than 64 bits (it has 19 digits in a row)."""
    raw = text.encode() if isinstance(text, str) else text
    return _DIGIT_RUN.search(raw) is not None


def _refuse_constant(name: str) -> None:
    raise ValueError(f"{name} is not JSON")
