"""LoRA adapters on a chat head: their files on this host, and which are loaded.

The gateway sends an ``AdapterRef`` with each adapter request
(docs/reference/adapters.md). ``AdapterFiles`` turns it into a local folder vLLM can
load: an uploaded adapter's two files are fetched once from the gateway's object
store into ``<models dir>/adapters/<key>`` (the key names the content, so a cached
folder is never stale); an operator adapter names a folder, or ``prepared:<name>``.

``AdapterSlots`` keeps the engine's loaded set, keyed by the adapter's unique id
(``AdapterRef.key``), which is also vLLM's LoRA name and Serve's multiplexed model id:
adapter names are unique only within an organization, so two organizations' adapters
of one name, or a deleted name uploaded again, are different adapters here and never
share weights (``<base>:<name>`` is only for messages). Which adapters stay loaded is decided
by a least-recently-used policy of at most ``max_loras``: Ray Serve's model
multiplexing in a Serve replica (so the router sends an adapter's requests to a
replica that holds it), or ``AdapterSlots``' own order in process (tests). An
adapter still in use by a running request is unloaded only when that request ends:
vLLM's serving layer looks the adapter up again when generation starts.

A deleted adapter is forgotten (``AdapterSlots.forget``): unloaded, its files dropped,
and its key remembered so that a late request cannot load it again; in a Serve replica
``drop_multiplexed`` also takes it out of Serve's multiplexing LRU, so the replica stops
reporting it to the routers and the gateway's repeated ``forget_adapter`` reaches the
next replica that holds it (docs/reference/adapters.md#deleting).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import shutil
import tempfile
from collections import OrderedDict
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any, Protocol

from serve_app.contract.adapters import AdapterObjects, AdapterRef, ForgetReply
from serve_app.contract.errors import ModelUnavailableError, model_not_found
from serve_app.contract.paths import models_dir_from_environment

logger = logging.getLogger(__name__)

MAX_FORGOTTEN = 4096
"""Deleted adapters' keys a replica remembers (keys are never reused: a bound on memory)."""
MULTIPLEX_WRAPPER_ATTR = "__serve_multiplex_wrapper"
"""Where ``serve.multiplexed`` keeps its ``_ModelMultiplexWrapper`` on the load function
(Ray 2.60, ``ray/serve/api.py``), created on its first call."""


class AdapterEngine(Protocol):
    """What the slots need of a ``TextEngine`` (``VLLMEngine`` implements it)."""

    async def load_adapter(self, lora_name: str, path: str) -> None: ...

    async def unload_adapter(self, lora_name: str) -> None: ...


class AdapterFiles:
    """An adapter's folder on this host, fetched from the gateway's store on first use."""

    def __init__(
        self,
        open_objects: Callable[[], AdapterObjects] | None,
        cache_dir: Path | None = None,
        resolve_path: Callable[[str], str] | None = None,
    ) -> None:
        """``open_objects`` opens the gateway's object store in this process (None: only
        operator adapters); ``resolve_path`` turns ``prepared:<name>`` into a folder."""
        self._open_objects = open_objects
        self._objects: AdapterObjects | None = None
        self.cache_dir = cache_dir or models_dir_from_environment() / "adapters"
        self._resolve_path = resolve_path or (lambda path: path)

    def folder(self, ref: AdapterRef) -> str:
        """The adapter's local folder (blocking: call it in a thread)."""
        if ref.path is not None:
            return self._resolve_path(ref.path)
        target = self.cache_dir / ref.key
        if all((target / name).is_file() for name, _ in ref.objects):
            return str(target)
        if self._open_objects is None:
            raise ModelUnavailableError("This head cannot fetch uploaded adapters.")
        if self._objects is None:
            self._objects = self._open_objects()
        self.cache_dir.mkdir(parents=True, exist_ok=True)
        staging = Path(tempfile.mkdtemp(prefix=f".{ref.key}-", dir=self.cache_dir))
        try:
            for name, key in ref.objects:
                (staging / name).write_bytes(self._objects.get(key))
            with contextlib.suppress(OSError):  # another process won the race: keep its copy
                staging.rename(target)
        finally:
            shutil.rmtree(staging, ignore_errors=True)
        return str(target)

    def remove(self, key: str) -> None:
        """Drop a cached uploaded adapter (it was deleted)."""
        if "/" not in key and key not in ("", ".", ".."):
            shutil.rmtree(self.cache_dir / key, ignore_errors=True)


class AdapterSlots:
    """The adapters loaded into one engine, with in-use pinning.

    ``max_loaded``: evict the least recently used beyond this many (in process); None
    where Ray Serve's multiplexing decides and calls ``evict``.
    """

    def __init__(
        self, engine: AdapterEngine, files: AdapterFiles, max_loaded: int | None = None
    ) -> None:
        self.engine = engine
        self.files = files
        self.max_loaded = max_loaded
        self._loaded: OrderedDict[str, AdapterRef] = OrderedDict()
        """Key -> ref, least recently used first."""
        self._draining: dict[str, AdapterRef] = {}
        """Evicted while requests still generate with them: unloaded when the last ends."""
        self._users: dict[str, int] = {}
        self._forgotten: OrderedDict[str, None] = OrderedDict()
        """Keys of deleted adapters (``forget``): never loaded again here."""
        self._lock = asyncio.Lock()

    @property
    def loaded(self) -> list[str]:
        """Keys of the adapters loaded now, least recently used first."""
        return list(self._loaded)

    async def load(self, ref: AdapterRef) -> None:
        """Load ``ref`` unless loaded; the files are fetched off the event loop, and only
        other loads wait on the lock (base-model requests never touch it). A deleted
        adapter (``forget``) is not found: a request resolved before the deletion."""
        if ref.key in self._forgotten:
            raise model_not_found(ref.model_id)
        if self._reuse(ref):
            return
        async with self._lock:
            if self._reuse(ref):
                return
            path = await asyncio.to_thread(self.files.folder, ref)
            if self.max_loaded is not None:
                while len(self._loaded) >= self.max_loaded:
                    await self.evict(next(iter(self._loaded)))
            await self.engine.load_adapter(ref.key, path)
            self._loaded[ref.key] = ref
            logger.info("adapter %s loaded (%s)", ref.key, ref.model_id)

    def _reuse(self, ref: AdapterRef) -> bool:
        draining = self._draining.pop(ref.key, None)
        if draining is not None:  # asked again before it was unloaded
            self._loaded[ref.key] = draining
        if ref.key not in self._loaded:
            return False
        self._loaded.move_to_end(ref.key)
        return True

    async def evict(self, key: str) -> None:
        """Unload adapter ``key`` now, or when its last running request ends."""
        ref = self._loaded.pop(key, None)
        if ref is None:
            return
        if self._users.get(key):
            self._draining[key] = ref
            return
        await self.engine.unload_adapter(key)
        logger.info("adapter %s unloaded (%s)", key, ref.model_id)

    async def forget(self, key: str, held: bool = False) -> ForgetReply:
        """The adapter was deleted: unload it, drop its cached files and never load it
        again. ``held``: the caller dropped it from Serve's LRU (``drop_multiplexed``)."""
        known = key in self._forgotten
        self._forgotten[key] = None
        self._forgotten.move_to_end(key)
        while len(self._forgotten) > MAX_FORGOTTEN:
            self._forgotten.popitem(last=False)
        loaded = key in self._loaded
        await self.evict(key)  # one still generating is unloaded when it ends
        draining = key in self._draining
        await asyncio.to_thread(self.files.remove, key)
        if known:
            return "forgotten"
        return "unloaded" if held or loaded or draining else "absent"

    @contextlib.asynccontextmanager
    async def using(self, ref: AdapterRef) -> AsyncIterator[None]:
        """Pin ``ref`` loaded while a request generates with it."""
        key = ref.key
        self._users[key] = self._users.get(key, 0) + 1
        try:
            yield
        finally:
            left = self._users[key] - 1
            if left:
                self._users[key] = left
            else:
                del self._users[key]
                if self._draining.pop(key, None) is not None:
                    await self.engine.unload_adapter(key)
                    logger.info("adapter %s unloaded (%s)", key, ref.model_id)


class MultiplexedAdapter:
    """What Serve's multiplexing holds per adapter: evicted, it unloads from the engine.

    Ray Serve calls a held model's ``__del__`` when its LRU drops it, in an executor
    thread for a plain method; the unload then runs on the replica's loop. Called a
    second time (by the garbage collector) it does nothing.
    """

    def __init__(self, slots: AdapterSlots, key: str, loop: Any) -> None:
        self._slots = slots
        self.key = key
        self._loop = loop
        self._done = False

    def disarm(self) -> None:
        """Taken out of Serve's LRU by ``drop_multiplexed``: the slots unload it; a later
        ``__del__`` must not evict it again after a reload under the same key."""
        self._done = True

    def __del__(self) -> None:
        if self._done or self._loop.is_closed():
            return
        self._done = True
        future = asyncio.run_coroutine_threadsafe(self._slots.evict(self.key), self._loop)
        try:
            asyncio.get_running_loop()
        except RuntimeError:  # Serve's executor thread: wait, so the LRU stays exact
            with contextlib.suppress(Exception):
                future.result(timeout=60)


async def drop_multiplexed(load: Callable[..., Any], key: str) -> bool:
    """Take ``key`` out of the LRU of Serve's multiplexing wrapper of ``load`` (the
    function given to ``serve.multiplexed``) and have the replica push its model ids at
    once, so routers stop sending ``key``'s requests here; whether it was held.

    Serve has no public call to drop one model: this reads the wrapper's ``models``
    (an ``OrderedDict``), ``_model_cache_lock`` and ``_push_multiplexed_replica_info``
    (Ray 2.60; tests/unit/adapters pins them). Where those are missing the replica keeps
    reporting ``key`` until its LRU evicts it, and says so in its log.
    """
    wrapper = getattr(load, MULTIPLEX_WRAPPER_ATTR, None)
    if wrapper is None:
        return False  # nothing was ever loaded through it on this replica
    models = getattr(wrapper, "models", None)
    lock = getattr(wrapper, "_model_cache_lock", None)
    if not isinstance(models, OrderedDict) or not isinstance(lock, asyncio.Lock):
        logger.warning("Serve's multiplexing wrapper changed: adapter %s stays listed", key)
        return False
    async with lock:  # a load of ``key`` under way finishes first, then is dropped
        model = models.pop(key, None)
    if model is None:
        return False
    wrapper._push_multiplexed_replica_info = True
    if isinstance(model, MultiplexedAdapter):
        model.disarm()
    return True
