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
import sys
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
from serve_app.inference.embeddings.inputs import embedding_inputs
from serve_app.inference.embeddings.service import EmbeddingService
from serve_app.inference.responses.service import ResponsesService
from serve_app.protocol.chat import ChatCompletionRequest
from serve_app.protocol.completions import CompletionRequest
from serve_app.protocol.embeddings import EmbeddingRequest
from serve_app.protocol.errors import GatewayError, InvalidRequestError
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


def estimate_tokens(endpoint: str, body: dict[str, Any], model: CatalogModel) -> int:
    """A line's tokens for the enqueued-token limit, from its body as the route reads it
    (``"n": 16.0`` is 16 there, so here): its JSON size over four, plus what it will
    produce. A body the route refuses runs nothing: its size alone."""
    try:
        parsed = ENDPOINTS[endpoint].parse(body)
    except GatewayError:
        parsed = None
    prompt = math.ceil(len(json.dumps(body, ensure_ascii=False)) / CHARS_PER_TOKEN)
    if parsed is None:
        return prompt
    if isinstance(parsed, EmbeddingRequest):
        return _embedding_tokens(parsed, model, prompt)
    return prompt + _output_tokens(parsed, model)


def _output_tokens(parsed: Any, model: CatalogModel) -> int:
    """A generation's output cap (its own, else the model's) times its answers: ``n`` per
    prompt, each prompt of a completions list apart."""
    default = model.max_output_tokens or 0
    if isinstance(parsed, ChatCompletionRequest):
        return (parsed.requested_max_tokens()[0] or default) * parsed.n
    if isinstance(parsed, CompletionRequest):
        return (parsed.max_tokens or default) * parsed.n * len(parsed.prompts())
    if isinstance(parsed, ResponsesRequest):
        return parsed.max_output_tokens or default
    return default


def _embedding_tokens(parsed: EmbeddingRequest, model: CatalogModel, prompt: int) -> int:
    """Its inputs' tokens as the route reserves them, plus one per number of the answer
    (inputs times dimensions): a line of 2,048 one-character inputs is small to read
    and large to answer."""
    try:
        inputs = embedding_inputs(parsed.input, sys.maxsize)
    except GatewayError:
        return prompt
    spec = model.pooling
    dimensions = parsed.dimensions or (spec.dimensions if spec is not None else None) or 0
    read = inputs.estimated_tokens(model.context_length or sys.maxsize)
    return read + inputs.count * dimensions
