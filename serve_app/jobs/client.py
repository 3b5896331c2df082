"""How the gateway pokes a video head: a Ray handle, or in-process.

The poke is only a hint ("a job was queued, look now"): the job is already in
the database and the head's worker also polls, so a lost or failed poke delays
a job by at most one poll interval. Hence ``wake`` never raises.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any, Protocol

from serve_app.catalog.config import CatalogModel

logger = logging.getLogger(__name__)

WAKE_TIMEOUT_S = 10.0


class VideoHeadClient(Protocol):
    async def wake(self) -> None: ...


class LocalWorker(Protocol):
    """A video head's worker in this process (``deployments.video_head.VideoHeadCore``)."""

    def wake(self) -> None: ...


class LocalVideoClient:
    """Pokes a ``VideoHeadCore`` in this process (unit tests)."""

    def __init__(self, core: LocalWorker) -> None:
        self.core = core

    async def wake(self) -> None:
        self.core.wake()


class RayVideoClient:
    """Pokes a ``VideoHead`` deployment through its handle."""

    def __init__(self, model_id: str, handle: Any) -> None:
        self.model_id = model_id
        self._handle = handle

    async def wake(self) -> None:
        try:
            await asyncio.wait_for(self._handle.wake.remote(), WAKE_TIMEOUT_S)
        except Exception as err:  # the worker's poll finds the job anyway
            logger.info("video head %s not poked (%s); it will poll", self.model_id, err)


def ray_video_clients(
    catalog: list[CatalogModel], heads: dict[str, Any]
) -> dict[str, VideoHeadClient]:
    """Ray clients for the bound video heads."""
    return {
        m.id: RayVideoClient(m.id, heads[m.id])
        for m in catalog
        if m.id in heads and m.head == "video"
    }
