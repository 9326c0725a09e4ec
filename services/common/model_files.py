"""Chat-template models' files on the bus: workers publish them into a JetStream object
store, by digest; the API and the parser copy what they need into the local model files
directory (``dialects.model_files_dir()``), where the dialects read them.

Objects never expire and never change under a digest: a response names the digest it
was rendered with, so that its tokens can be re-parsed with the same files at any time."""

from __future__ import annotations

import hashlib
import os
import tempfile

from nats.js import JetStreamContext
from nats.js.api import ObjectStoreConfig, StorageType
from nats.js.errors import NotFoundError, ObjectNotFoundError
from nats.js.object_store import ObjectStore

from steno.schemas.bus import ChatTemplateFiles
from steno.services.common.bus import Names, object_store
from steno.services.dialects import model_files_dir


class ModelFilesMissing(LookupError):
    """No worker published the files of this digest (or they were removed)."""


async def model_files_store(js: JetStreamContext, names: Names) -> ObjectStore:
    return await object_store(js, ObjectStoreConfig(
        bucket=names.model_files_store, storage=StorageType.FILE, replicas=names.replicas))


async def publish_model_files(js: JetStreamContext, names: Names, files: ChatTemplateFiles) -> str:
    """Puts ``files`` into the store (once: a digest's content never changes); their digest."""
    digest = files.digest()
    store = await model_files_store(js, names)
    try:
        await store.get_info(digest)
    except (ObjectNotFoundError, NotFoundError):
        await store.put(digest, files.model_dump_json().encode())
    return digest


async def ensure_model_files(js: JetStreamContext, names: Names, digest: str) -> None:
    """Copies the files of ``digest`` into the local directory unless they are there."""
    directory = model_files_dir()
    path = directory / f"{digest}.json"
    if path.exists():
        return
    store = await model_files_store(js, names)
    try:
        data = (await store.get(digest)).data or b""
    except (ObjectNotFoundError, NotFoundError):
        raise ModelFilesMissing(f"no model files {digest} in the bus's model files store") from None
    if hashlib.sha256(data).hexdigest() != digest:
        raise ModelFilesMissing(f"the model files stored as {digest} do not match their digest")
    directory.mkdir(parents=True, exist_ok=True)
    # Written aside and renamed, so a reader (a render process) never sees half a file.
    handle, partial = tempfile.mkstemp(dir=directory, suffix=".partial")
    with os.fdopen(handle, "wb") as out:
        out.write(data)
    os.replace(partial, path)
