"""The endpoints a batch may target, and how a line reaches the live service for it.

A line runs through the same service call as the route of its URL, with the batch
owner's ``Principal``: the same validation (the route's pydantic model, whose
errors become the same 400), the same rules, caps, tools and errors. Each entry
names the request model, the catalog kind its ``model`` must be, and the call.
Adding an endpoint is one entry here (and, for a new service, its attribute in
``BatchServices``), as ``/v1/embeddings`` was.
"""

from __future__ import annotations

import json
import math
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, Protocol

from pydantic import BaseModel, ValidationError

from serve_app.auth.principal import Principal
from serve_app.catalog.catalog import Catalog
from serve_app.catalog.config import CatalogModel, HeadKind
from serve_app.inference.answers import Answer
from serve_app.inference.chat.service import TextService
from serve_app.inference.chat.tools import ToolChatService
from serve_app.inference.chat.translate import reject_unencodable
from serve_app.inference.embeddings.service import EmbeddingService
from serve_app.inference.responses.service import ResponsesService
from serve_app.protocol.chat import ChatCompletionRequest
from serve_app.protocol.completions import CompletionRequest
from serve_app.protocol.embeddings import EmbeddingRequest
from serve_app.protocol.errors import InvalidRequestError
from serve_app.protocol.responses import ResponsesRequest
from serve_app.protocol.validation import validation_error

CHARS_PER_TOKEN = 4
"""Rough prompt size of a line before its model's tokenizer has seen it."""


class BatchServices(Protocol):
    """The live services batch lines call (the replica's ``GatewayState`` has them)."""

    text: TextService
    tool_chat: ToolChatService
    responses: ResponsesService
    embeddings: EmbeddingService


@dataclass(frozen=True)
class BatchEndpoint:
    request: type[BaseModel]
    model_kind: HeadKind
    run: Callable[[BatchServices, Any, Principal], Awaitable[Answer]]

    def parse(self, body: dict[str, Any]) -> Any:
        """The line's body as the route would have read it, or the route's 400."""
        try:
            parsed = self.request.model_validate(body)
        except ValidationError as err:
            raise validation_error(err.errors()) from None
        if getattr(parsed, "stream", False):
            raise InvalidRequestError(
                "Streaming is not supported in batch requests; omit 'stream'.",
                code="invalid_value",
                param="stream",
            )
        return parsed


async def _completion(services: BatchServices, body: Any, who: Principal) -> Answer:
    reject_unencodable(body)
    return await services.text.completion(body, who)


ENDPOINTS: dict[str, BatchEndpoint] = {
    "/v1/chat/completions": BatchEndpoint(
        ChatCompletionRequest, "chat", lambda s, body, who: s.tool_chat.answer(body, who)
    ),
    "/v1/completions": BatchEndpoint(CompletionRequest, "chat", _completion),
    "/v1/responses": BatchEndpoint(
        ResponsesRequest, "chat", lambda s, body, who: s.responses.create(body, who)
    ),
    "/v1/embeddings": BatchEndpoint(
        EmbeddingRequest, "pooling", lambda s, body, who: s.embeddings.embeddings(body, who)
    ),
}


ModelResolver = Callable[[str], CatalogModel]
"""A line's ``model`` to the model it runs on, or the ``GatewayError`` its route answers."""


def line_models(
    services: BatchServices, catalog: Catalog, endpoint: str, principal: Principal
) -> ModelResolver:
    """How validation resolves a line's model: as the endpoint's own route does for
    ``principal``, off the event loop. The chat routes' resolution includes the
    organization's and the catalog's LoRA adapters (``TextService.resolve_blocking``,
    the synchronous twin of what the line runs through); the others the catalog's."""
    kind = ENDPOINTS[endpoint].model_kind
    if kind == "chat":
        text = services.text
        return lambda model_id: text.resolve_blocking(model_id, principal)
    return lambda model_id: catalog.resolve(model_id, principal, kind)


def estimate_tokens(body: dict[str, Any], model: CatalogModel) -> int:
    """A line's tokens for the enqueued-token limit: its JSON size over four, plus its
    output cap (its own ``max_*tokens``, else the model's) times ``n``."""
    prompt = math.ceil(len(json.dumps(body, ensure_ascii=False)) / CHARS_PER_TOKEN)
    cap = next(
        (
            body[name]
            for name in ("max_completion_tokens", "max_tokens", "max_output_tokens")
            if isinstance(body.get(name), int)
        ),
        model.max_output_tokens or 0,
    )
    n = body.get("n") if isinstance(body.get("n"), int) else 1
    return prompt + max(0, int(cap)) * max(1, int(n or 1))
