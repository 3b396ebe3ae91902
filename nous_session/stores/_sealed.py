"""Sealed records: what both SQL stores do with an :class:`~nous_session.encryption.Encryption`
(see docs/erasure.md, "Encryption at rest and crypto-erasure").

A sealed record is ``b"\\x01" + kid (16 bytes) + nonce (12) + AES-GCM(data key)(record)``, the
associated data ``b"nous_session/v1"`` and the seq as 8 bytes big-endian (a record moved to
another seq does not open). A plain record is JSON and never starts with ``0x01``, so both
kinds can live in one table. The row's ``kid`` column repeats the record's kid, so that every
row sealed under a key can be found by an index.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable, Sequence
from typing import TYPE_CHECKING, Final

import attrs

from nous_session.encryption import Encryption, KeyProvider, aead
from nous_session.errors import CorruptRecordError, StoreError

if TYPE_CHECKING:
    from cryptography.hazmat.primitives.ciphers.aead import AESGCM

__all__ = [
    "MAGIC",
    "Fetch",
    "KeyGone",
    "Keyring",
    "NewKey",
    "is_sealed",
    "kid_of",
]

MAGIC: Final = 1
"""The first byte of a sealed record."""

_KID: Final = 16
_NONCE: Final = 12
_HEAD: Final = 1 + _KID + _NONCE
_AAD: Final = b"nous_session/v1"

Fetch = Callable[[bytes], tuple[str, bytes] | None]
"""Reads a data key's row from the store's key table: (provider name, wrapped key), or None."""

NewKey = tuple[bytes, str, bytes]
"""A new data key's row: kid, the provider's name, the wrapped key."""


class KeyGone(CorruptRecordError):
    """A sealed record's data key is not in the store: an erasure destroyed it (a read that
    raced that erasure reads again: the rows are re-sealed under the key's successor)."""


def is_sealed(record: bytes | memoryview) -> bool:
    """Whether ``record`` is sealed (a plain record is JSON: it starts with ``[``)."""
    return len(record) > 0 and record[0] == MAGIC


def kid_of(record: bytes | memoryview) -> bytes | None:
    """The kid a record is sealed under, or None for a plain record."""
    return bytes(record[1 : 1 + _KID]) if is_sealed(record) else None


class Keyring:
    """A store's data keys: the unwrapped ones cached by kid (for the store object's life),
    the current kid of the sessions it wrote, and sealing and opening records.

    Thread-safe as the stores use it: a dict's get and set are atomic, and two threads that
    unwrap one key at once store equal values.
    """

    __slots__ = ("_aead", "_ciphers", "current", "encryption")

    def __init__(self, encryption: Encryption) -> None:
        self.encryption = encryption
        self._aead = aead()
        self._ciphers: dict[bytes, AESGCM] = {}
        # The kid each session was last seen to seal with (checked by every commit against
        # the stored one: an erasure replaces it).
        self.current: dict[str, bytes] = {}

    # Keys -------------------------------------------------------------------------------------

    def new_key(self) -> NewKey:
        """A new data key, wrapped by the store's provider (one provider call), and cached."""
        provider = self.encryption.provider
        kid = os.urandom(_KID)
        key = self._aead.generate_key(bit_length=256)
        try:
            wrapped = provider.wrap(key)
        except Exception as error:
            raise StoreError(
                f"the key provider {provider.name!r} could not wrap a new data key: {error}"
            ) from error
        self._ciphers[kid] = self._aead(key)
        return kid, provider.name, bytes(wrapped)

    def cipher(self, kid: bytes, fetch: Fetch) -> AESGCM:
        """The data key ``kid``, unwrapped once (its row read by ``fetch``).

        Raises:
            CorruptRecordError: the store holds no such key (an erasure destroyed it).
            StoreError: its master key's provider was not given to this store, or cannot
                unwrap it.
        """
        found = self._ciphers.get(kid)
        if found is not None:
            return found
        row = fetch(kid)
        if row is None:
            raise KeyGone(
                f"data key {kid.hex()} is not in the store (an erasure destroyed it): a record"
                " sealed under it cannot be opened"
            )
        name, wrapped = row
        key = self._unwrap(kid, name, bytes(wrapped))
        cipher = self._ciphers[kid] = self._aead(key)
        return cipher

    def cached(self, kid: bytes | None) -> AESGCM | None:
        """The data key ``kid`` if it is unwrapped already, else None."""
        return None if kid is None else self._ciphers.get(kid)

    def _unwrap(self, kid: bytes, name: str, wrapped: bytes) -> bytes:
        provider = self.encryption.provider_named(name)
        if provider is None:
            raise StoreError(
                f"data key {kid.hex()} is wrapped by master key {name!r}, which this store was"
                f" not given (its encryption's providers: {self._names()}); pass its provider,"
                " as Encryption(provider, previous=[...]) while keys are re-wrapped"
            )
        try:
            key = provider.unwrap(wrapped)
        except Exception as error:
            raise StoreError(
                f"master key {name!r} could not unwrap data key {kid.hex()}: {error}"
            ) from error
        if len(key) != 32:
            raise StoreError(
                f"master key {name!r} unwrapped data key {kid.hex()} to {len(key)} bytes, not 32"
            )
        return bytes(key)

    def _names(self) -> str:
        encryption = self.encryption
        return ", ".join(repr(p.name) for p in (encryption.provider, *encryption.previous))

    def rewrapped(self, rows: Iterable[tuple[bytes, str, bytes]], to: KeyProvider) -> list[NewKey]:
        """The key table's ``(kid, provider, wrapped)`` rows wrapped by ``to`` instead (a row
        wrapped by ``to`` already is kept as it is).

        Raises:
            StoreError: a key cannot be unwrapped, or ``to`` cannot wrap it.
        """
        done: list[NewKey] = []
        for kid, name, wrapped in rows:
            kid = bytes(kid)
            if name == to.name:
                done.append((kid, name, bytes(wrapped)))
                continue
            key = self._unwrap(kid, name, bytes(wrapped))
            try:
                again = to.wrap(key)
            except Exception as error:
                raise StoreError(
                    f"the key provider {to.name!r} could not wrap data key {kid.hex()}: {error}"
                ) from error
            done.append((kid, to.name, bytes(again)))
        return done

    def use(self, provider: KeyProvider) -> None:
        """Wrap new keys with ``provider`` from now on (after a re-wrap); the store's other
        providers still unwrap what they wrapped."""
        old = self.encryption
        previous = [p for p in (old.provider, *old.previous) if p.name != provider.name]
        self.encryption = Encryption(provider, previous=previous)

    def forget(self, kid: bytes) -> None:
        """Drop a destroyed key from the cache."""
        self._ciphers.pop(kid, None)

    def destroyed(self, kids: Sequence[bytes]) -> None:
        """Keys a delete destroyed: out of the cache, and no session's current key any more."""
        for kid in kids:
            self.forget(kid)
        for name, current in list(self.current.items()):
            if current in kids:
                del self.current[name]

    # Records ----------------------------------------------------------------------------------

    def seal(self, kid: bytes, cipher: AESGCM, seq: int, record: bytes) -> bytes:
        """``record`` (a plain record, at ``seq``) sealed under the data key ``kid``."""
        nonce = os.urandom(_NONCE)
        return b"\x01" + kid + nonce + cipher.encrypt(nonce, record, _AAD + seq.to_bytes(8, "big"))

    def seal_rows(
        self, kid: bytes, cipher: AESGCM, rows: Sequence[tuple[int, bytes]]
    ) -> list[tuple[int, bytes]]:
        """Plain ``(seq, record)`` rows sealed under ``kid``."""
        head, urandom, encrypt = b"\x01" + kid, os.urandom, cipher.encrypt
        sealed = []
        for seq, record in rows:
            nonce = urandom(_NONCE)
            sealed.append(
                (seq, head + nonce + encrypt(nonce, record, _AAD + seq.to_bytes(8, "big")))
            )
        return sealed

    def open(self, seq: int, record: bytes | memoryview, fetch: Fetch, where: str) -> bytes:
        """The plain record a (sealed or plain) stored record at ``seq`` holds.

        Raises:
            CorruptRecordError: it cannot be opened (a key destroyed, the record damaged or
                moved from another seq); ``where`` names it.
        """
        from cryptography.exceptions import InvalidTag

        if not is_sealed(record):
            return bytes(record)
        if len(record) < _HEAD + 16:
            raise CorruptRecordError(f"{where}: a sealed record too short to hold one")
        kid = bytes(record[1 : 1 + _KID])
        try:
            cipher = self.cipher(kid, fetch)
        except KeyGone as error:
            raise KeyGone(f"{where}: {error}") from None
        nonce = bytes(record[1 + _KID : _HEAD])
        try:
            return cipher.decrypt(nonce, bytes(record[_HEAD:]), _AAD + seq.to_bytes(8, "big"))
        except InvalidTag:
            raise CorruptRecordError(
                f"{where}: the sealed record does not open under its data key {kid.hex()}"
                " (damaged, or moved from another seq)"
            ) from None

    def open_rows(
        self,
        rows: Iterable[tuple[int, bytes]],
        fetch: Fetch,
        place: Callable[[int], str],
    ) -> list[tuple[int, bytes]]:
        """``(seq, record)`` rows with every sealed record opened (the plain ones as they are)."""
        opened: list[tuple[int, bytes]] = []
        append = opened.append
        for seq, record in rows:
            if record and record[0] == MAGIC:
                append((seq, self.open(seq, record, fetch, place(seq))))
            else:
                append((seq, record))
        return opened


@attrs.frozen
class CryptoErasure:
    """What a crypto-erasure did: keys destroyed, rows re-sealed, and whether a copy was in
    plain text (then the store rewrites its tables or file too)."""

    destroyed: int
    resealed: int
    plain: bool

    def detail(self, scrubbed: str) -> str:
        """The start of the erasure's ``detail``; ``scrubbed`` says how the store scrubbed its
        key table."""
        return (
            f"crypto-erasure: {self.destroyed} data key(s) destroyed; {self.resealed} row(s)"
            f" re-sealed under new key(s); {scrubbed}"
        )
