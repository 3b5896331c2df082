"""``/v1/messages`` and ``/v1/messages/count_tokens`` over the chat service.

A Messages call is translated into the chat request it means and answered by
``TextService.chat``, so it passes the same catalog resolution (adapters and
dedicated endpoints included), readiness, head, limits, quotas, ledger and
metrics as that chat call, and costs what it costs: nothing here meters. The
chat answer comes back as bytes (a ``Body``, or a ``FrameStream`` of chat
chunks) and is rewritten into Anthropic's shapes (``render.py``). Closing the
Anthropic stream closes the chat stream, which bills what was produced
(``MeteredStream``), as on chat.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Iterable
from dataclasses import dataclass
from typing import Any
from urllib.parse import unquote

from pydantic import ValidationError

from serve_app.auth.principal import Principal
from serve_app.inference.answers import Answer, Body, FrameStream
from serve_app.inference.chat.service import TextService
from serve_app.inference.chat.translate import reject_unencodable
from serve_app.inference.messages.render import PING, StreamRenderer, event, message_body
from serve_app.inference.messages.translate import STOP_IN_OUTPUT, ChatPlan, to_chat
from serve_app.inference.streams import aclose_quietly
from serve_app.protocol.chat import ChatCompletionRequest
from serve_app.protocol.headers import IGNORED_PARAMS_HEADER, ignored_params_header
from serve_app.protocol.messages import (
    BETAS_HEADER,
    CountTokensRequest,
    CountTokensResponse,
    MessagesRequest,
)
from serve_app.protocol.validation import validation_error

KNOWN_BETAS = frozenset(
    {
        # Served as the API is without them: prompt caching is the engine's own, token
        # counting and tools are routes and fields here, tool input streams as generated.
        "prompt-caching-2024-07-31",
        "token-counting-2024-11-01",
        "tools-2024-04-04",
        "tools-2024-05-16",
        "fine-grained-tool-streaming-2025-05-14",
        "messages-2023-12-15",
    }
)
"""``anthropic-beta`` values the gateway serves; others are named in ``x-service-ignored-betas``
(docs/reference/messages.md#headers)."""


@dataclass(frozen=True)
class MessagesSettings:
    ping_s: float = 10.0
    """A ``ping`` event after this long without one (besides the one after ``message_start``)."""


class MessagesService:
    def __init__(self, text: TextService, settings: MessagesSettings | None = None) -> None:
        self.text = text
        self.settings = settings or MessagesSettings()

    async def create(
        self, body: MessagesRequest, principal: Principal, betas: Iterable[str] = ()
    ) -> Answer:
        reject_unencodable(body)
        model = await self.text.resolve(body.model, principal)
        plan = to_chat(body, model)
        answer = await self.text.chat(_chat_request(plan), principal)
        headers = _headers(answer.headers, plan.ignored, betas)
        if isinstance(answer, Body):
            message = message_body(json.loads(answer.content), plan.stop_sequences)
            return Body.json(message.model_dump(), headers=headers)
        renderer = StreamRenderer(model.id, plan.stop_sequences)
        frames = anthropic_frames(answer.frames, renderer, self.settings.ping_s)
        return FrameStream(frames, answer.release, headers)

    async def count_tokens(
        self, body: CountTokensRequest, principal: Principal, betas: Iterable[str] = ()
    ) -> Body:
        """The prompt's tokens as the model's head renders them (template and tools
        included); nothing is generated, so nothing is billed."""
        reject_unencodable(body)
        model = await self.text.resolve(body.model, principal)
        plan = to_chat(body, model)
        plan.body["max_tokens"] = 1
        tokens = await self.text.prompt_tokens(_chat_request(plan), model)
        answer = CountTokensResponse(input_tokens=tokens)
        return Body.json(answer.model_dump(), headers=_headers({}, plan.ignored, betas))


def _chat_request(plan: ChatPlan) -> ChatCompletionRequest:
    try:
        return ChatCompletionRequest.model_validate(plan.body)
    except ValidationError as exc:
        raise validation_error(exc.errors()) from None


def _headers(chat: dict[str, str], ignored: list[str], betas: Iterable[str]) -> dict[str, str]:
    """The chat answer's headers, with the Messages request's own ignored fields."""
    headers = {k: v for k, v in chat.items() if k.lower() != IGNORED_PARAMS_HEADER}
    names = [unquote(n) for n in chat.get(IGNORED_PARAMS_HEADER, "").split(", ") if n]
    names = [n for n in names if n != STOP_IN_OUTPUT] + ignored
    headers.update(ignored_params_header(names))
    unknown = sorted({b for b in betas if b and b not in KNOWN_BETAS})
    if unknown:
        headers[BETAS_HEADER] = ignored_params_header(unknown)[IGNORED_PARAMS_HEADER]
    return headers


def parse_betas(values: Iterable[str]) -> list[str]:
    """``anthropic-beta`` header values (comma-separated, possibly repeated)."""
    return [b.strip() for value in values for b in value.split(",") if b.strip()]


def _data(frame: bytes) -> Iterable[bytes]:
    for line in frame.split(b"\n"):
        if line.startswith(b"data:"):
            yield line[5:].strip()


async def _next(frames: AsyncIterator[bytes]) -> bytes:
    return await anext(frames)


async def anthropic_frames(
    frames: AsyncIterator[bytes], renderer: StreamRenderer, ping_s: float
) -> AsyncIterator[bytes]:
    """The chat stream's frames as Anthropic events, with a ``ping`` after ``message_start``
    and whenever ``ping_s`` pass without a frame; closing this closes the chat stream."""
    pending: asyncio.Future[bytes] | None = None
    started = False
    try:
        while not renderer.ended:
            if pending is None:
                pending = asyncio.ensure_future(_next(frames))
            done, _ = await asyncio.wait({pending}, timeout=ping_s)
            if not done:
                if started:
                    yield PING
                continue
            task, pending = pending, None
            try:
                frame = task.result()
            except StopAsyncIteration:
                break
            for data in _data(frame):
                out: list[bytes] = []
                chunk: dict[str, Any] = {} if data == b"[DONE]" else json.loads(data)
                if not started and "error" not in chunk and data != b"[DONE]":
                    out += renderer.start(str(chunk.get("id", "")))
                    out.append(PING)
                    started = True
                out += renderer.finish() if data == b"[DONE]" else renderer.chunk(chunk)
                for item in out:
                    yield item
        if not renderer.ended:
            error = {"type": "api_error", "message": "The model stream ended without a result."}
            yield event("error", {"type": "error", "error": error})
    finally:
        if pending is not None:
            pending.cancel()
            await asyncio.gather(pending, return_exceptions=True)
        await aclose_quietly(frames)
