"""How the gateway reaches a head: over a Ray handle, or in-process in tests.

Both clients yield the same ``HeadEvent`` values. The Ray client also maps
Ray's own failures (no replica, backpressure, a dead actor) to the spec's 503
and 502 so a route never sees a Ray exception type.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator
from typing import Any, Protocol

from deployments.chat_head import ChatHeadCore
from serve_app.contract.text import HeadEvent, HeadRequest
from serve_app.protocol.errors import ModelUnavailableError, UpstreamError

logger = logging.getLogger(__name__)


class HeadClient(Protocol):
    """A stream of head events for one request."""

    def stream(self, request: HeadRequest) -> AsyncIterator[HeadEvent]: ...


class LocalHeadClient:
    """Calls a ``ChatHeadCore`` in this process (unit tests, benchmarks)."""

    def __init__(self, core: ChatHeadCore) -> None:
        self.core = core

    def stream(self, request: HeadRequest) -> AsyncIterator[HeadEvent]:
        return self.core.generate(request)


class RayHeadClient:
    """Calls a ``ChatHead`` deployment through its DeploymentHandle.

    The handle streams over Serve's gRPC transport (``_by_reference=False``), not
    as Ray object references: a streamed item is then one message on a gRPC
    stream instead of a Ray object the caller is told about, fetches and frees.
    Measured together with the proxy's gRPC transport (``gateway run`` sets
    ``RAY_SERVE_PROXY_USE_GRPC``), under 32 streams proxy + gateway + head CPU per
    token fell by about a third (bench/RESULTS.md).
    """

    def __init__(self, model_id: str, handle: Any) -> None:
        self.model_id = model_id
        self._handle = handle.options(stream=True, _by_reference=False)

    async def stream(self, request: HeadRequest) -> AsyncIterator[HeadEvent]:
        import grpc
        from ray import exceptions as ray_exceptions
        from ray.serve import exceptions as serve_exceptions

        response = self._handle.generate.remote(request)
        finished = False
        try:
            async for item in response:
                # Heads send batches (deployments.stream_batching); a single event
                # is accepted too, from heads that do not batch.
                if isinstance(item, list):
                    for event in item:
                        yield event
                else:
                    yield item
            finished = True
        except serve_exceptions.BackPressureError:
            raise ModelUnavailableError(
                f"Model '{self.model_id}' is at capacity; retry shortly.",
                headers={"Retry-After": "1"},
            ) from None
        except (ray_exceptions.ActorDiedError, ray_exceptions.ActorUnavailableError) as err:
            logger.warning("head %s replica lost: %s", self.model_id, err)
            raise ModelUnavailableError(
                f"Model '{self.model_id}' lost its replica; retry shortly."
            ) from None
        except ray_exceptions.RayTaskError as err:
            logger.error("head %s failed: %s", self.model_id, err)
            raise UpstreamError(f"Model '{self.model_id}' failed.") from None
        except grpc.aio.AioRpcError as err:  # the transport broke (UNAVAILABLE is mapped above)
            logger.error("head %s call failed: %s %s", self.model_id, err.code(), err.details())
            raise UpstreamError(f"Model '{self.model_id}' failed.") from None
        finally:
            if not finished:
                # Closed early (a 429 after HeadStarted, the client left): stop the head's
                # generation now rather than when the response is collected, which over
                # gRPC (a handle whose router runs on its own loop keeps reading) is never.
                response.cancel()
