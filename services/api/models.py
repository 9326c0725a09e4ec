"""Which models live workers serve, and in which dialect: the worker registry (a KV
bucket the workers refresh), kept in memory so a request costs no round trip."""

from __future__ import annotations

import logging
from functools import lru_cache

from pydantic import ValidationError

from steno.schemas.bus import WorkerRegistration
from steno.services.common.bus import model_token
from steno.services.common.kv_mirror import KvMirror

log = logging.getLogger(__name__)


class ModelDirectory:
    def __init__(self, registry: KvMirror, wait_s: float) -> None:
        """``wait_s``: how long a request for a model no worker serves waits for one."""
        self._registry = registry
        self._wait_s = wait_s

    async def registration(self, model: str) -> WorkerRegistration | None:
        """The model's registration: from the copy in memory, else from the registry
        itself (the copy may lag), else the first to come within the wait. None when
        no live worker serves the model."""
        key = model_token(model)
        registry = self._registry
        value = registry.get(key) or await registry.fetch(key)
        if value is None and await registry.wait_for(lambda: key in registry, self._wait_s):
            value = registry.get(key)
        if value is None:
            value = await registry.fetch(key)
        return _registration(model, value) if value is not None else None


# The same few registrations are read for every request.
@lru_cache(maxsize=1024)
def _registration(model: str, value: bytes) -> WorkerRegistration | None:
    try:
        registration = WorkerRegistration.model_validate_json(value)
    except ValidationError:
        log.warning("the registration of model %s is not one this API reads: %r", model, value[:200])
        return None
    # Two names can share a subject token ("a/b", "a_b"): only the named one is served.
    return registration if registration.model == model else None
