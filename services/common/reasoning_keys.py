"""Where the keys that seal reasoning live (``reasoning_seal.py``), shared by the API
(which opens blobs) and the parsers (which seal them).

``STENO_REASONING_KEYS`` (``id:base64-secret`` pairs, comma-separated, the first one
sealing) when it is set: keys kept in a secret store. Otherwise Postgres holds them
(``reasoning_keys``), made on first use, so that every replica and restart agrees
with no setting at all; ``steno reasoning-keys rotate`` adds a newer key and
``retire`` ends an old one's blobs."""

from __future__ import annotations

import asyncio
import base64
import binascii
import os
import secrets
import time

import asyncpg

from steno.services.common.reasoning_seal import SECRET_BYTES, ReasoningSeal, SealingKey

ENV_VAR = "STENO_REASONING_KEYS"
# A rotation or a retirement reaches every process within this many seconds.
REFRESH_S = 5.0
# A blob naming a key this process does not hold has the keys read again, at most this
# often (a blob cannot make a process query Postgres at will).
UNKNOWN_KEY_REREAD_S = 1.0


def keys_from_setting(value: str) -> list[SealingKey]:
    keys = []
    for pair in value.split(","):
        key_id, sep, secret = pair.strip().partition(":")
        if not sep:
            raise ValueError(f"{ENV_VAR} takes id:base64-secret pairs, comma-separated")
        try:
            keys.append(SealingKey(key_id, base64.b64decode(secret + "=" * (-len(secret) % 4), altchars=b"-_")))
        except binascii.Error as exc:
            raise ValueError(f"{ENV_VAR}: the secret of {key_id!r} is not base64") from exc
    return keys


def new_key() -> SealingKey:
    return SealingKey("rk_" + secrets.token_hex(6), secrets.token_bytes(SECRET_BYTES))


def setting_for(key: SealingKey) -> str:
    return f"{key.key_id}:{base64.urlsafe_b64encode(key.secret).decode()}"


async def rotate(pool: asyncpg.Pool) -> str:
    """Adds a newer key, which seals from then on; the id."""
    key = new_key()
    await pool.execute("INSERT INTO reasoning_keys (id, secret) VALUES ($1, $2)", key.key_id, key.secret)
    return key.key_id


async def retire(pool: asyncpg.Pool, key_id: str) -> bool:
    status = await pool.execute(
        "UPDATE reasoning_keys SET retired_at = now() WHERE id = $1 AND retired_at IS NULL", key_id)
    return status.endswith(" 1")


async def list_keys(pool: asyncpg.Pool) -> list[asyncpg.Record]:
    return await pool.fetch("SELECT id, created_at, retired_at FROM reasoning_keys ORDER BY created_at DESC, id")


async def _stored(pool: asyncpg.Pool) -> list[SealingKey]:
    """The active keys, newest first; the first is made here when there is none."""
    query = "SELECT id, secret FROM reasoning_keys WHERE retired_at IS NULL ORDER BY created_at DESC, id"
    rows = await pool.fetch(query)
    if not rows:
        await rotate(pool)
        rows = await pool.fetch(query)
    return [SealingKey(row["id"], bytes(row["secret"])) for row in rows]


class ReasoningKeys:
    """The keys as this process holds them."""

    def __init__(self, pool: asyncpg.Pool, setting: str | None = None) -> None:
        """``setting``: the value of STENO_REASONING_KEYS (read from the environment when
        not given); with one, Postgres is not consulted."""
        setting = os.environ.get(ENV_VAR) if setting is None else setting
        self._pool = pool
        self._configured = ReasoningSeal(keys_from_setting(setting)) if setting else None
        self._seal: ReasoningSeal | None = None
        self._read_at = -float("inf")
        self._lock = asyncio.Lock()

    async def _read(self) -> ReasoningSeal:
        self._seal = ReasoningSeal(await _stored(self._pool))
        self._read_at = time.monotonic()
        return self._seal

    async def current(self) -> ReasoningSeal:
        if self._configured is not None:
            return self._configured
        if self._seal is None or time.monotonic() - self._read_at >= REFRESH_S:
            async with self._lock:
                if self._seal is None or time.monotonic() - self._read_at >= REFRESH_S:
                    return await self._read()
        assert self._seal is not None
        return self._seal

    async def holding(self, key_id: str) -> ReasoningSeal:
        """The keys, read again if ``key_id`` is not among them (a key made elsewhere
        since); it may still not be (retired, or never made)."""
        seal = await self.current()
        if seal.knows(key_id) or self._configured is not None:
            return seal
        missed_at = time.monotonic()
        async with self._lock:
            if self._read_at < missed_at:  # nobody has read the keys since
                await asyncio.sleep(max(0.0, self._read_at + UNKNOWN_KEY_REREAD_S - time.monotonic()))
                await self._read()
            assert self._seal is not None
            return self._seal
