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

    def served(self) -> list[WorkerRegistration]:
        """Every model a live worker serves."""
        found = (_registration(None, value) for _, value in self._registry.items())
        return sorted((r for r in found if r is not None), key=lambda registration: registration.model)


# The same few registrations are read for every request.
@lru_cache(maxsize=1024)
def _registration(model: str | None, value: bytes) -> WorkerRegistration | None:
    """The registration in ``value``, if it is for ``model`` (any, when None)."""
    try:
        registration = WorkerRegistration.model_validate_json(value)
    except ValidationError:
        log.warning("a model registration this API does not read: %r", value[:200])
        return None
    return registration if model is None or registration.model == model else None
