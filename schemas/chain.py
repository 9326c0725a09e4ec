"""The event log's hash chain: what a stored event's ``hash`` is (the one definition;
the API, the parser and ``steno audit`` all call it).

``hash(event) = sha256(hash(previous event) || UTF-8 bytes of the event's payload)``.
The previous event of a response's first event (seq 0) is the last stored event of the
response it continues (``previous_response_id``, or the conversation's previous
response), whose hash the response records (``responses.chained_to_hash``); a response
that continues nothing chains to ``GENESIS``. The payload is the exact JSON text a
client receives, so the chain proves those bytes, in that order."""

from __future__ import annotations

import hashlib
from collections.abc import Iterable

HASH_BYTES = 32
# What the first event of a response that continues nothing chains to.
GENESIS = bytes(HASH_BYTES)


def event_hash(previous: bytes, payload: str) -> bytes:
    return hashlib.sha256(previous + payload.encode()).digest()


def chain_hashes(previous: bytes, payloads: Iterable[str]) -> list[bytes]:
    """The hashes of events stored in this order after the one whose hash is ``previous``."""
    hashes = []
    for payload in payloads:
        previous = event_hash(previous, payload)
        hashes.append(previous)
    return hashes
