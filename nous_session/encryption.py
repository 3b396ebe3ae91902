"""Encryption at rest: the records a SQL store writes, sealed under per-session data keys,
so that erasing an event can destroy the key its old bytes were sealed under (crypto-erasure).

A store given an :class:`Encryption` (``SQLiteStore(path, encryption=...)``,
``PostgresStore(url, encryption=...)``, ``open_store(url, encryption=...)``) seals every
record it writes with AES-256-GCM under the session's current *data key*, a random 32-byte
key made at the session's first encrypted commit and stored in the store's key table
*wrapped* (encrypted) by a :class:`KeyProvider`: the master key, which the store never
writes. Erasing an event destroys the data keys its old records were sealed under, after
re-sealing every other row under a new key (see docs/erasure.md, "Encryption at rest and
crypto-erasure").

Needs the ``crypto`` extra (``pip install 'nous_session[crypto]'``, the ``cryptography``
package); importing this module does not import it.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import os
import stat
from collections.abc import Iterable
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final, Protocol, runtime_checkable

import attrs

if TYPE_CHECKING:
    from cryptography.hazmat.primitives.ciphers.aead import AESGCM

__all__ = ["Encryption", "KeyProvider", "LocalKeyFile", "RewrappingStore", "rewrap"]

INSTALL: Final = "pip install 'nous_session[crypto]'"

_MASTER_SIZE: Final = 32
_NONCE: Final = 12
_WRAP_AAD: Final = b"nous_session/data-key/v1"


def aead() -> type[AESGCM]:
    """The AES-GCM class of ``cryptography``.

    Raises:
        ImportError: the ``crypto`` extra is not installed (the message says how).
    """
    try:
        from cryptography.hazmat.primitives.ciphers.aead import AESGCM
    except ImportError as error:
        raise ImportError(
            f"encryption at rest needs the cryptography package: {INSTALL}"
        ) from error
    return AESGCM


@runtime_checkable
class KeyProvider(Protocol):
    """What wraps and unwraps the data keys: the master key (a key file, a KMS key).

    A store calls :meth:`wrap` once per new data key (a session's first encrypted commit,
    and each key an erasure makes) and :meth:`unwrap` once per data key it first reads after
    it opens: unwrapped keys are cached in the store object. A KMS-backed provider therefore
    costs one KMS call per new data key and one per key per process, not one per record. Both
    are called in the store's worker threads (a blocking call is fine).

    Attributes:
        name: the master key's id and version, stored with every key it wraps: a store
            finds the provider of a wrapped key by it, so it must differ between master keys
            (``"local:<fingerprint>"``, ``"kms:<key arn>:<version>"``).
    """

    name: str

    def wrap(self, key: bytes) -> bytes:
        """``key`` encrypted under the master key."""
        ...

    def unwrap(self, wrapped: bytes) -> bytes:
        """The key :meth:`wrap` encrypted.

        Raises:
            ValueError: ``wrapped`` was not made by this master key, or is damaged.
        """
        ...


class LocalKeyFile:
    """The default :class:`KeyProvider`: a 32-byte master key in a file, as base64 text.

    The key wraps data keys with AES-256-GCM (a random 12-byte nonce each). Its ``name`` is
    ``"local:"`` and a fingerprint of the key (not the key): a store opened with another key
    file says so by name instead of failing to decrypt.

    The file must not be readable by every user: one that is (mode ``o+r``) is refused, as
    ssh refuses a private key anyone can read (``chmod 600``, or ``640`` for a group of
    services). Make one with :meth:`create`.

    Args:
        path: the key file.

    Raises:
        FileNotFoundError: no such file (the message says how to make one).
        ValueError: the file is readable by everyone, or does not hold 32 bytes of base64.
        ImportError: the ``crypto`` extra is not installed.
    """

    __slots__ = ("_key", "name", "path")

    def __init__(self, path: str | os.PathLike[str]) -> None:
        aead()
        self.path = Path(path)
        try:
            status = self.path.stat()
            text = self.path.read_bytes()
        except FileNotFoundError:
            raise FileNotFoundError(
                f"no master key file at {self.path}; make one with"
                f" LocalKeyFile.create({str(self.path)!r})"
            ) from None
        if os.name == "posix" and status.st_mode & stat.S_IROTH:
            raise ValueError(
                f"the master key file {self.path} is readable by every user"
                f" (mode {stat.S_IMODE(status.st_mode):o}); chmod 600 it (or 640 for a group)"
            )
        try:
            key = base64.b64decode(text.strip(), validate=True)
        except (binascii.Error, ValueError):
            raise ValueError(f"the master key file {self.path} does not hold base64 text") from None
        if len(key) != _MASTER_SIZE:
            raise ValueError(
                f"the master key file {self.path} holds {len(key)} bytes; a master key is"
                f" {_MASTER_SIZE} bytes (make one with LocalKeyFile.create)"
            )
        self._key = key
        fingerprint = hashlib.sha256(b"nous_session/master-key-id\x00" + key).hexdigest()
        self.name = f"local:{fingerprint[:16]}"

    @classmethod
    def create(cls, path: str | os.PathLike[str]) -> LocalKeyFile:
        """Make a new master key file at ``path`` (mode 0600, from ``os.urandom``) and
        return its provider. Keep a copy somewhere safe: without it, nothing the stores
        encrypted with it can be read.

        Raises:
            FileExistsError: ``path`` exists (a key file is never overwritten).
            ImportError: the ``crypto`` extra is not installed.
        """
        aead()
        target = Path(path)
        text = base64.b64encode(os.urandom(_MASTER_SIZE)) + b"\n"
        try:
            descriptor = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        except FileExistsError:
            raise FileExistsError(
                f"{target} exists; a master key file is never overwritten"
            ) from None
        try:
            os.write(descriptor, text)
            os.fsync(descriptor)
        finally:
            os.close(descriptor)
        return cls(target)

    def wrap(self, key: bytes) -> bytes:
        """``key`` sealed under the master key: a 12-byte nonce, then AES-GCM's output."""
        nonce = os.urandom(_NONCE)
        return nonce + aead()(self._key).encrypt(nonce, bytes(key), _WRAP_AAD)

    def unwrap(self, wrapped: bytes) -> bytes:
        """The key :meth:`wrap` sealed.

        Raises:
            ValueError: it was not sealed by this master key, or is damaged.
        """
        from cryptography.exceptions import InvalidTag

        wrapped = bytes(wrapped)
        try:
            return aead()(self._key).decrypt(wrapped[:_NONCE], wrapped[_NONCE:], _WRAP_AAD)
        except (InvalidTag, ValueError):
            raise ValueError(
                f"the master key {self.name} ({self.path}) cannot unwrap this data key: it was"
                " wrapped by another master key, or is damaged"
            ) from None

    def __repr__(self) -> str:
        return f"LocalKeyFile({str(self.path)!r}, name={self.name!r})"


def _check_provider(provider: object) -> KeyProvider:
    if not isinstance(provider, KeyProvider) or not isinstance(provider.name, str):
        raise TypeError(
            "a key provider has a name (str) and wrap(key) and unwrap(wrapped) methods,"
            f" got {provider!r}"
        )
    if not provider.name:
        raise ValueError("a key provider's name is a non-empty string")
    return provider


def _providers(value: Iterable[Any]) -> tuple[KeyProvider, ...]:
    return tuple(_check_provider(item) for item in value)


@attrs.frozen
class Encryption:
    """What a store is given to encrypt its records at rest.

    Args:
        provider: wraps every new data key, and unwraps the keys it wrapped.
        previous: providers of older master keys, only to unwrap the data keys they wrapped
            (while a :func:`rewrap` to ``provider`` has not run yet).

    Raises:
        TypeError: a provider is not a :class:`KeyProvider`.
        ImportError: the ``crypto`` extra is not installed.
    """

    provider: KeyProvider = attrs.field(converter=_check_provider)
    previous: tuple[KeyProvider, ...] = attrs.field(default=(), converter=_providers, kw_only=True)

    def __attrs_post_init__(self) -> None:
        aead()

    def provider_named(self, name: str) -> KeyProvider | None:
        """The provider whose master key is ``name``, or None."""
        for provider in (self.provider, *self.previous):
            if provider.name == name:
                return provider
        return None


@runtime_checkable
class RewrappingStore(Protocol):
    """A store that encrypts at rest and can re-wrap its data keys (SQLite, PostgreSQL)."""

    async def rewrap(self, provider: KeyProvider) -> int:
        """Re-wrap every data key under ``provider``'s master key; how many."""
        ...


async def rewrap(store: object, provider: KeyProvider) -> int:
    """Re-wrap every live data key of ``store`` under ``provider``'s master key, in one
    transaction, then scrub the store's key table of the old wrapped keys; the store wraps
    new keys with ``provider`` from then on. Returns how many keys were re-wrapped.

    Afterwards the old master key is needed by nothing the store holds: destroy it, and
    every copy of the key table made before (a backup, a WAL archive, a replica) can no
    longer unwrap anything, including the keys an erasure destroyed since that copy was made.
    Rotating the master key this way on a schedule (daily, say) is how crypto-erasure
    reaches backups (see docs/erasure.md).

    Raises:
        TypeError: the store does not encrypt (it was opened without ``encryption=``) or
            cannot re-wrap.
        StoreError: a data key could not be unwrapped (its master key's provider was not
            given to the store) or the store failed; nothing was changed.
    """
    if not isinstance(store, RewrappingStore):
        raise TypeError(f"{store!r} cannot re-wrap data keys (it does not encrypt at rest)")
    return await store.rewrap(_check_provider(provider))
