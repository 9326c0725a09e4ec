"""Sealed reasoning (``include: ["reasoning.encrypted_content"]``): a reasoning item's text
as an opaque, authenticated blob a stateless client can send back (pure).

AES-256-GCM under a server-held key; the blob names its key, so that keys can be
rotated (new responses are sealed with the newest key, blobs under older ones still
open until their key is retired). It is bound to the tenant it was made for: another
tenant's blob, or a blob altered in any byte, does not open. The nonce is derived
from the key, the item and the text, so that re-parsing a response (an audit, a
takeover) seals it to the same bytes, and no two different texts share a nonce."""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import re
from collections.abc import Sequence
from dataclasses import dataclass

from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives.ciphers.aead import AESGCM

KEY_ID = re.compile(r"^[A-Za-z0-9_-]{1,32}$")
SECRET_BYTES = 32
_VERSION = b"\x01"
_NONCE_BYTES = 12
_CONTEXT = b"steno.reasoning.v1"


class SealError(ValueError):
    """A blob that does not open: malformed, altered, another tenant's, or under a key
    this server does not hold (any more)."""


@dataclass(frozen=True)
class SealingKey:
    key_id: str
    secret: bytes

    def __post_init__(self) -> None:
        if not KEY_ID.match(self.key_id):
            raise ValueError(f"a reasoning key id is 1-32 letters, digits, '_' or '-': {self.key_id!r}")
        if len(self.secret) != SECRET_BYTES:
            raise ValueError(f"a reasoning key is {SECRET_BYTES} bytes")


def _associated_data(tenant: str, key_id: str) -> bytes:
    return b"\0".join((_CONTEXT, tenant.encode(), key_id.encode()))


class ReasoningSeal:
    """The keys this server holds; the first seals, every one opens."""

    def __init__(self, keys: Sequence[SealingKey]) -> None:
        if not keys:
            raise ValueError("sealing needs at least one key")
        self._keys = {key.key_id: key for key in keys}
        self.current = keys[0].key_id

    def knows(self, key_id: str) -> bool:
        return key_id in self._keys

    def seal(self, text: str, *, tenant: str, item_id: str, key_id: str) -> str:
        key = self._keys[key_id]
        plain = text.encode()
        nonce = hmac.new(key.secret, b"\0".join((b"nonce", item_id.encode(), plain)), hashlib.sha256).digest()
        nonce = nonce[:_NONCE_BYTES]
        sealed = AESGCM(key.secret).encrypt(nonce, plain, _associated_data(tenant, key_id))
        name = key_id.encode()
        return base64.urlsafe_b64encode(_VERSION + bytes([len(name)]) + name + nonce + sealed).decode()

    def open(self, blob: str, *, tenant: str) -> str:
        key_id, nonce, sealed = _unpacked(blob)
        key = self._keys.get(key_id)
        if key is None:
            raise SealError("encrypted_content was sealed with a key this server does not hold")
        try:
            return AESGCM(key.secret).decrypt(nonce, sealed, _associated_data(tenant, key_id)).decode()
        except (InvalidTag, ValueError, UnicodeDecodeError) as exc:
            raise SealError("encrypted_content does not verify: altered, or made for another tenant") from exc


def key_id_of(blob: str) -> str:
    """The id of the key a blob names (not yet verified)."""
    return _unpacked(blob)[0]


def _unpacked(blob: str) -> tuple[str, bytes, bytes]:
    try:
        raw = base64.urlsafe_b64decode(blob.encode("ascii"))
    except (binascii.Error, UnicodeEncodeError, ValueError) as exc:
        raise SealError("encrypted_content is not one this server made") from exc
    name_end = 2 + raw[1] if len(raw) >= 2 else 0
    if raw[:1] != _VERSION or len(raw) < name_end + _NONCE_BYTES:
        raise SealError("encrypted_content is not one this server made")
    key_id = raw[2:name_end].decode("ascii", "replace")
    return key_id, raw[name_end:name_end + _NONCE_BYTES], raw[name_end + _NONCE_BYTES:]
