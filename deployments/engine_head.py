"""What every single-engine head (pooling, detect, parse, speech, transcription) does alike.

Each head kind keeps its own core (the rules of its API family); what is the same for
all of them lives here once:

- ``answer_as_value``: a head answers a failure as a ``HeadFailure`` value instead of
  raising (the contract's rule: an exception crossing a DeploymentHandle loses its
  status); a caller's mistake keeps its status, anything else is a 502 and is logged
  with the request id;
- ``EngineHead``: the replica's construction (logging into the replica's file, the
  engine the backend registry builds for the head's kind, its core, started, a line
  when it is ready) and its lifecycle around that engine: the waker's ``wake`` call,
  Serve's health check, and the engine's shutdown when Serve stops the replica.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any, ClassVar, Protocol, TypeVar

from deployments import registry
from deployments.replica_logging import configure_replica_logging
from serve_app.contract.errors import GatewayError, HeadFailure, UpstreamError

logger = logging.getLogger(__name__)

Result = TypeVar("Result")


async def answer_as_value(
    kind: str, request_id: str, work: Awaitable[Result]
) -> Result | HeadFailure:
    """Run ``work``; caller mistakes keep their status, anything else is a 502."""
    try:
        return await work
    except GatewayError as err:
        return HeadFailure.from_error(err)
    except Exception as err:
        logger.exception("%s failed for %s", kind, request_id)
        return HeadFailure.from_error(UpstreamError(f"The {kind} model failed: {err}"))


class HeadEngine(Protocol):
    """The lifecycle part of every head engine contract."""

    async def check_health(self) -> None: ...

    async def shutdown(self) -> None: ...


class EngineCore(Protocol):
    """A head's core, as far as its replica's lifecycle needs it."""

    @property
    def engine(self) -> HeadEngine: ...

    async def start(self) -> Any: ...


class EngineHead:
    """Base of a Serve head class around one engine's core.

    A subclass names its ``kind`` and ``core_class`` (narrowing ``core`` by a class-level
    annotation); the constructor here serves it as it is, and a head whose constructor
    takes more (a transcription head's audio bound, a pooling head's counters) calls
    ``start_engine`` from its own.
    """

    kind: ClassVar[str]
    """Its head kind (``serve_app.contract.head_kinds``): what the registry builds."""
    core_class: ClassVar[type[Any]]
    """The core class, built around the engine (``core_class(engine)``)."""
    core: EngineCore
    one_item_streams: ClassVar[frozenset[str]] = frozenset()
    """Unary methods a caller may also read as a one-item stream (``answer_streamed``)."""

    async def __init__(  # type: ignore[misc]  # Ray Serve awaits async constructors
        self, model_id: str, backend: str, engine_config: dict[str, Any]
    ) -> None:
        await self.start_engine(model_id, backend, engine_config, self.core_class)

    async def start_engine(
        self,
        model_id: str,
        backend: str,
        engine_config: dict[str, Any],
        make_core: Callable[[Any], EngineCore],
        *extra: Any,
    ) -> Any:
        """The one construction of a single-engine head: the replica's logging, the engine
        ``backend`` names for this kind (``extra``: what its builder takes after the
        config), the core ``make_core`` puts around it, started; what ``start`` said."""
        configure_replica_logging()
        self.model_id = model_id
        self.core = make_core(registry.build_engine(self.kind, backend, engine_config, *extra))
        info = await self.core.start()
        logger.info("%s head %s ready (%s)", self.kind, model_id, info)
        return info

    async def answer_streamed(self, method: str, *args: Any) -> AsyncIterator[Any]:
        """``method``'s reply as the only item of a stream (the contract's ``ONE_ITEM_STREAM``).

        Why a stream for one reply: over Serve's gRPC transport the caller gets a streamed
        item as soon as it arrives, while a unary reply is handed over only with the call's
        final status (head -> gateway 1.03 instead of 1.63 ms at 1 request in flight), and
        with unary calls the head's engine ran 2-5% slower per input than vLLM's own
        server beside it (docs/tuning.md, embeddings). Only ``one_item_streams`` methods.
        """
        if method not in self.one_item_streams:
            raise ValueError(f"{type(self).__name__} does not stream {method!r}")
        yield await getattr(self, method)(*args)

    async def wake(self) -> None:
        """Nothing to do: a call waiting for a replica is what scales a sleeping head up."""

    async def check_health(self) -> None:
        await self.core.engine.check_health()

    async def __del__(self) -> None:
        await self.core.engine.shutdown()
