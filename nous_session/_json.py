"""Validating deep copies of JSON values (shared by messages and events).

The rules: str-keyed dicts (any mapping is accepted and stored as a dict), lists (tuples are
stored as lists), str (valid Unicode: a lone surrogate cannot be encoded, so it is refused here
rather than when a store encodes the batch it is in), int in the signed 64-bit range, finite
float, bool and None. Subclasses of
str, int and float (enums, for instance) are stored as the plain base value, so what is kept is
exactly what a JSON round trip gives back.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any, TypeAlias

import orjson

__all__ = [
    "JSON",
    "MAX_DEPTH",
    "NotJSONError",
    "check_text",
    "copy_json",
    "copy_json_object",
    "format_path",
]

JSON: TypeAlias = "dict[str, JSON] | list[JSON] | str | int | float | bool | None"

_INT_MIN = -(2**63)
_INT_MAX = 2**63 - 1
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


def format_path(parts: object) -> str:
    """``["a", 1]`` -> ``["a"][1]``; keys are JSON-quoted so odd characters stay readable."""
    out = []
    for part in parts:  # type: ignore[attr-defined]
        if isinstance(part, int):
            out.append(f"[{part}]")
        else:
            out.append(f"[{orjson.dumps(part).decode()}]")
    return "".join(out)


def _describe(value: object) -> str:
    if isinstance(value, float):
        return f"{value!r} is not a finite number"
    if isinstance(value, int):
        return f"{value} is outside the signed 64-bit range"
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


def copy_json(value: object, depth: int = 0) -> JSON:
    """Return a deep, JSON-only copy of ``value``.

    Raises:
        NotJSONError: naming the first offender; its ``path`` leads to it.
    """
    t = type(value)
    if t is str:
        return check_text(value)  # type: ignore[arg-type]
    if value is None or t is bool:
        return value  # type: ignore[return-value]
    if t is int:
        if _INT_MIN <= value <= _INT_MAX:  # type: ignore[operator]
            return value  # type: ignore[return-value]
        raise NotJSONError(_describe(value))
    if t is float:
        if math.isfinite(value):  # type: ignore[arg-type]
            return value  # type: ignore[return-value]
        raise NotJSONError(_describe(value))
    if t is dict or isinstance(value, Mapping):
        return copy_json_object(value, depth)  # type: ignore[arg-type]
    if t is list or t is tuple:
        if depth >= MAX_DEPTH:
            raise NotJSONError(f"containers nest deeper than {MAX_DEPTH} levels")
        out: list[JSON] = []
        index = 0
        try:
            items: list[object] = value  # type: ignore[assignment]
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


def copy_json_object(value: Mapping[Any, object], depth: int = 0) -> dict[str, JSON]:
    """Return a deep, JSON-only copy of a mapping with string keys.

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
        if (t is str and item.isascii()) or item is None or t is bool:  # type: ignore[attr-defined]
            out[key] = item  # type: ignore[assignment]
            continue
        try:
            out[key] = copy_json(item, depth + 1)
        except NotJSONError as e:
            e.path.append(key)
            raise
    return out
