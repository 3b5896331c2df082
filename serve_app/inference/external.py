"""Heads served by an external OpenAI-compatible provider (spec 1, 2.3).

``ExternalHeadClient`` speaks the same ``HeadEvent`` stream as a Ray head, so
validation, limits, metering and stream framing stay identical for own-fleet
and external models; only the disclosure (``routing``) differs, added by the
text service. The upstream is always called with ``stream: true`` and
``include_usage`` so usage is metered from the provider's own count, and a
client that asked for JSON still gets one body.

Retries happen only where no output can have been produced: a connection that
never opened, or a 429/503 answer. Nothing is retried once a byte arrived.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
from collections.abc import AsyncIterator
from typing import Any

import httpx

from deployments.engines.base import GenerationDone, PromptSpec, TextDelta, ToolCallDelta
from deployments.head_protocol import HeadEvent, HeadFailure, HeadRequest, HeadStarted
from serve_app.catalog.config import CatalogModel, ExternalProvider
from serve_app.protocol.errors import (
    GatewayError,
    InvalidRequestError,
    ModelUnavailableError,
    UpstreamError,
    UpstreamTimeoutError,
)

logger = logging.getLogger(__name__)

_RETRY_STATUSES = frozenset({429, 503})
_BACKOFF_S = (0.5, 1.0)


class ExternalHeadClient:
    """A ``HeadClient`` for one external model."""

    def __init__(self, model: CatalogModel, client: httpx.AsyncClient | None = None) -> None:
        assert model.external is not None
        self.model_id = model.id
        self.provider: ExternalProvider = model.external
        self._client = client or httpx.AsyncClient(
            timeout=httpx.Timeout(self.provider.timeout_s, connect=10.0)
        )

    async def stream(self, request: HeadRequest) -> AsyncIterator[HeadEvent]:
        path, body = upstream_body(request, self.provider.upstream_model)
        yield HeadStarted(
            prompt_tokens=estimate_prompt_tokens(request.prompts),
            max_tokens=request.max_tokens or request.max_output_tokens,
        )
        try:
            async with self._open(path, body) as response:
                async for event in _events(response):
                    yield event
        except GatewayError as err:
            yield HeadFailure.from_error(err)
        except httpx.TimeoutException:
            yield HeadFailure.from_error(
                UpstreamTimeoutError(f"The provider of '{self.model_id}' timed out.")
            )
        except httpx.HTTPError as err:
            logger.warning("external %s failed: %s", self.model_id, err)
            yield HeadFailure.from_error(
                UpstreamError(f"The provider of '{self.model_id}' failed ({type(err).__name__}).")
            )

    def _open(self, path: str, body: dict[str, Any]) -> _UpstreamCall:
        return _UpstreamCall(self, path, body)

    async def send(self, path: str, body: dict[str, Any]) -> httpx.Response:
        """POST with retries limited to the cases where nothing was generated."""
        headers = {"Authorization": f"Bearer {os.environ.get(self.provider.api_key_env, '')}"}
        url = self.provider.base_url.rstrip("/") + path
        for attempt in range(len(_BACKOFF_S) + 1):
            last = attempt == len(_BACKOFF_S)
            try:
                request = self._client.build_request("POST", url, json=body, headers=headers)
                response = await self._client.send(request, stream=True)
            except httpx.ConnectError:
                if last:
                    raise ModelUnavailableError(
                        f"The provider of '{self.model_id}' cannot be reached."
                    ) from None
            else:
                if response.status_code not in _RETRY_STATUSES or last:
                    return response
                await response.aclose()
            await asyncio.sleep(_BACKOFF_S[attempt])
        raise AssertionError("unreachable")


class _UpstreamCall:
    """Async context manager: an upstream response that is 2xx, or the mapped error."""

    def __init__(self, client: ExternalHeadClient, path: str, body: dict[str, Any]) -> None:
        self._client = client
        self._path = path
        self._body = body
        self._response: httpx.Response | None = None

    async def __aenter__(self) -> httpx.Response:
        response = await self._client.send(self._path, self._body)
        self._response = response
        if response.status_code >= 400:
            await response.aread()
            await response.aclose()
            raise upstream_status_error(response, self._client.model_id)
        return response

    async def __aexit__(self, *exc: object) -> None:
        if self._response is not None:
            await self._response.aclose()


def upstream_status_error(response: httpx.Response, model_id: str) -> GatewayError:
    """Map a provider's error status to ours (spec 7: 502/503/504, or the client's 400)."""
    message = _error_message(response)
    status = response.status_code
    if status in (400, 404, 409, 413, 422):
        return InvalidRequestError(f"The provider refused the request: {message}")
    if status in _RETRY_STATUSES:
        headers = {}
        if response.headers.get("retry-after", "").isdigit():
            headers["Retry-After"] = response.headers["retry-after"]
        return ModelUnavailableError(
            f"The provider of '{model_id}' is over capacity; retry shortly.", headers=headers
        )
    if status == 504:
        return UpstreamTimeoutError(f"The provider of '{model_id}' timed out.")
    return UpstreamError(f"The provider of '{model_id}' failed with status {status}.")


def _error_message(response: httpx.Response) -> str:
    try:
        data = response.json()
        return str(data.get("error", {}).get("message") or data)[:500]
    except (ValueError, AttributeError):
        return response.text[:500] or f"status {response.status_code}"


def upstream_body(request: HeadRequest, upstream_model: str) -> tuple[str, dict[str, Any]]:
    """The provider request for a validated head request (always streamed, with usage)."""
    sampling = request.sampling
    body: dict[str, Any] = {
        "model": upstream_model,
        "stream": True,
        "stream_options": {"include_usage": True},
        "n": sampling.n,
        **sampling.extra,
    }
    for name in ("temperature", "top_p", "seed", "frequency_penalty", "presence_penalty"):
        if (value := getattr(sampling, name)) is not None:
            body[name] = value
    if sampling.stop:
        body["stop"] = list(sampling.stop)
    if request.max_tokens is not None:
        body[request.max_tokens_param] = request.max_tokens
    first = request.prompts[0]
    if first.kind == "completion":
        body["prompt"] = [p.prompt or "" for p in request.prompts]
        return "/completions", body
    body["messages"] = first.messages or []
    if first.tools:
        body["tools"] = first.tools
        if first.tool_choice is not None:
            body["tool_choice"] = first.tool_choice
    if first.chat_template_kwargs:
        body["chat_template_kwargs"] = first.chat_template_kwargs
    return "/chat/completions", body


def estimate_prompt_tokens(prompts: list[PromptSpec]) -> int:
    """About four characters per token: enough to reserve limits before the provider counts."""
    size = sum(len(json.dumps(p.messages or p.prompt or "", ensure_ascii=False)) for p in prompts)
    return max(1, size // 4)


async def _events(response: httpx.Response) -> AsyncIterator[HeadEvent]:
    """Provider SSE chunks -> head events; tool-call fragments are joined per call."""
    tokens: dict[int, int] = {}
    calls: dict[tuple[int, int], dict[str, str]] = {}
    done: GenerationDone | None = None
    async for line in response.aiter_lines():
        if not line.startswith("data:"):
            continue
        data = line[len("data:") :].strip()
        if data == "[DONE]":
            break
        chunk = json.loads(data)
        if isinstance(chunk.get("error"), dict):
            raise UpstreamError(f"The provider failed mid-stream: {chunk['error'].get('message')}")
        if chunk.get("usage"):
            done = _usage(chunk["usage"])
        for choice in chunk.get("choices") or []:
            delta = _delta(choice, tokens, calls)
            if delta is not None:
                yield delta
    yield done or GenerationDone(prompt_tokens=0, completion_tokens=sum(tokens.values()))


def _delta(
    choice: dict[str, Any], tokens: dict[int, int], calls: dict[tuple[int, int], dict[str, str]]
) -> TextDelta | None:
    index = int(choice.get("index", 0))
    delta = choice.get("delta") or {}
    text = delta.get("content") or choice.get("text") or ""
    reasoning = delta.get("reasoning_content") or delta.get("reasoning") or ""
    for part in delta.get("tool_calls") or []:
        slot = calls.setdefault((index, int(part.get("index", 0))), {"name": "", "arguments": ""})
        slot["id"] = part.get("id") or slot.get("id", "")
        function = part.get("function") or {}
        slot["name"] += function.get("name") or ""
        slot["arguments"] += function.get("arguments") or ""
    finish = choice.get("finish_reason")
    if text or reasoning:
        tokens[index] = tokens.get(index, 0) + 1
    if not (text or reasoning or finish):
        return None
    finished_calls = [
        ToolCallDelta(id=c.get("id", ""), name=c["name"], arguments=c["arguments"], index=i)
        for (choice_index, i), c in sorted(calls.items())
        if choice_index == index and finish
    ]
    return TextDelta(
        choice_index=index,
        text=text,
        reasoning=reasoning,
        tool_calls=finished_calls,
        finish_reason=finish,
        completion_tokens=tokens.get(index, 0),
    )


def _usage(usage: dict[str, Any]) -> GenerationDone:
    cached = (usage.get("prompt_tokens_details") or {}).get("cached_tokens")
    reasoning = (usage.get("completion_tokens_details") or {}).get("reasoning_tokens")
    return GenerationDone(
        prompt_tokens=int(usage.get("prompt_tokens", 0)),
        completion_tokens=int(usage.get("completion_tokens", 0)),
        cached_tokens=int(cached) if cached is not None else None,
        reasoning_tokens=int(reasoning) if reasoning is not None else None,
    )
