"""Session metadata: the record that says whose a session is and what it is.

A session's metadata is a small typed record (:class:`SessionMetadata`: owner, app, title,
tags, and the application's own JSON fields under ``extra``). It lives in the session's log as
a ``session_metadata`` event holding the whole record (the newest such event wins), so history,
:meth:`~nous_session.log.Log.upto` and forks carry it like any other event: a fork starts with
the metadata its parent had at the fork point, a rewind (which changes what the model sees)
leaves it alone, and a snapshot always keeps metadata events. Every store also keeps a copy of
the current record beside the session, with its created and last-active times, written in the
same transaction as the event: that copy is what
:class:`~nous_session.listing.ListQuery` searches (see :mod:`nous_session.listing`).

This module is pure: no I/O, and it imports no other module of nous_session but ``_json``.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from types import MappingProxyType
from typing import Final, cast

import attrs

from nous_session._json import JSON, NotJSONError, copy_json_object, dumps

__all__ = ["MAX_METADATA_BYTES", "SessionMetadata"]

MAX_METADATA_BYTES: Final = 16384
"""The largest metadata record, in bytes of compact JSON: it is copied into every listing."""
_MAX_NAME_BYTES: Final = 256  # owner, app, a tag
MAX_TITLE_BYTES: Final = 1024
_MAX_TAGS: Final = 64
_FIELDS: Final = frozenset({"owner", "app", "title", "tags", "extra"})
_EMPTY: Final[Mapping[str, JSON]] = MappingProxyType({})


def bounded_text(
    value: object, what: str, most: int, *, expected: str = "a non-empty string"
) -> str:
    """``value`` as a plain ``str``, refused unless it is a non-empty string of valid Unicode
    (no lone surrogates) without NUL characters, of at most ``most`` UTF-8 bytes: what every
    store can index (session ids, idempotency keys, metadata names).

    Raises:
        ValueError: naming ``what`` and what is wrong (``expected``: what it must be).
    """
    if not isinstance(value, str) or not value:
        raise ValueError(f"{what} must be {expected}, got {value!r}")
    if "\x00" in value:
        raise ValueError(f"{what} cannot contain NUL characters: {value!r}")
    try:
        size = len(value) if value.isascii() else len(value.encode())
    except UnicodeEncodeError as error:
        raise ValueError(
            f"{what} must be valid Unicode; {value!r} has a lone surrogate at index {error.start}"
        ) from None
    if size > most:
        raise ValueError(f"{what} is at most {most} UTF-8 bytes; this one has {size}")
    return str.__str__(value)


def check_text(name: str, value: object, most: int) -> str | None:
    if value is None:
        return None
    return bounded_text(value, f"metadata {name}", most, expected="a non-empty string or None")


def _owner(value: object) -> str | None:
    return check_text("owner", value, _MAX_NAME_BYTES)


def _app(value: object) -> str | None:
    return check_text("app", value, _MAX_NAME_BYTES)


def _title(value: object) -> str | None:
    return check_text("title", value, MAX_TITLE_BYTES)


def check_tags(value: object) -> frozenset[str]:
    if isinstance(value, str) or not isinstance(value, Iterable):
        raise ValueError(f"metadata tags must be a collection of strings, got {value!r}")
    tags = frozenset(check_text("tag", tag, _MAX_NAME_BYTES) or "" for tag in value)
    if len(tags) > _MAX_TAGS:
        raise ValueError(f"a session has at most {_MAX_TAGS} tags, got {len(tags)}")
    return tags


def _extra(value: object) -> Mapping[str, JSON]:
    if not isinstance(value, Mapping):
        raise ValueError(f"metadata extra must be a mapping of JSON values, got {value!r}")
    try:
        copied = copy_json_object(value)
    except NotJSONError as error:
        raise ValueError(f"metadata extra is not JSON: {error.where('extra')}: {error}") from None
    return MappingProxyType(copied)


@attrs.frozen
class SessionMetadata:
    """A session's metadata: who it belongs to, what it is, and the application's fields.

    Every field is optional. Strings are non-empty valid Unicode without NUL (owner, app and
    each tag at most 256 UTF-8 bytes, the title 1024); at most 64 tags; ``extra`` is a mapping
    of JSON values (copied, read-only); the whole record as compact JSON is at most
    :data:`MAX_METADATA_BYTES`.

    Attributes:
        owner: the user (or tenant) the session belongs to; listings filter on it first.
        app: the application or agent it belongs to.
        title: a human-readable title.
        tags: labels to filter by.
        extra: the application's own fields, filterable with ``where={"key": value}``.

    Raises:
        ValueError: naming the field that is wrong.
    """

    owner: str | None = attrs.field(default=None, converter=_owner)
    app: str | None = attrs.field(default=None, converter=_app)
    title: str | None = attrs.field(default=None, converter=_title)
    tags: frozenset[str] = attrs.field(default=frozenset(), converter=check_tags)
    extra: Mapping[str, JSON] = attrs.field(default=_EMPTY, converter=_extra, eq=False)

    def __attrs_post_init__(self) -> None:
        size = len(dumps(self.to_json()))
        if size > MAX_METADATA_BYTES:
            raise ValueError(
                f"session metadata is at most {MAX_METADATA_BYTES} bytes of JSON; this is {size}"
            )

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, SessionMetadata):
            return NotImplemented
        return self.to_json() == other.to_json()

    def __hash__(self) -> int:
        return hash(dumps(self.to_json()))

    def to_json(self) -> dict[str, JSON]:
        """The record as JSON (what the event and the stores hold): the fields that are set,
        tags sorted."""
        out: dict[str, JSON] = {}
        if self.owner is not None:
            out["owner"] = self.owner
        if self.app is not None:
            out["app"] = self.app
        if self.title is not None:
            out["title"] = self.title
        if self.tags:
            out["tags"] = cast(list[JSON], sorted(self.tags))
        if self.extra:
            out["extra"] = dict(self.extra)
        return out

    @classmethod
    def from_json(cls, data: object) -> SessionMetadata:
        """The record ``data`` (as :meth:`to_json` gives it) describes.

        Raises:
            ValueError: ``data`` is not a mapping, has a field other than owner, app, title,
                tags and extra (the application's own go under ``extra``), or a bad value.
        """
        if not isinstance(data, Mapping):
            raise ValueError(f"session metadata must be a mapping, got {data!r}")
        unknown = sorted(str(key) for key in data if key not in _FIELDS)
        if unknown:
            raise ValueError(
                f"unknown session metadata field(s) {', '.join(unknown)}: the fields are owner,"
                " app, title, tags and extra (put the application's own fields under extra)"
            )
        return cls(
            owner=data.get("owner"),
            app=data.get("app"),
            title=data.get("title"),
            tags=data.get("tags", ()),
            extra=data.get("extra", _EMPTY),
        )

    @classmethod
    def coerce(cls, value: object) -> SessionMetadata:
        """``value`` if it is a SessionMetadata, else :meth:`from_json` of it.

        Raises:
            ValueError: as :meth:`from_json`.
        """
        if isinstance(value, SessionMetadata):
            return value
        return cls.from_json(value)
