"""Heads served by an external OpenAI-compatible provider (docs/reference/README.md,
docs/reference/common.md#external-models).

``ExternalHeadClient`` speaks the same ``HeadEvent`` stream as a Ray head, so
validation, limits, metering and stream framing stay identical for own-fleet
and external models; only the disclosure (``routing``) differs, added by the
text service. The upstream is always called with ``stream: true`` and
``include_usage`` so usage is metered from the provider's own count, and a
client that asked for JSON still gets one body. What is sent (an allow-list of
fields) and the gateway's own count where the provider reports no usable usage
are in ``serve_app.heads.external_request``.

Retries happen only where no output can have been produced: a connection that
never opened, or a 429/503 answer. Nothing is retried once a byte arrived.
"""

from __future__ import annotations

import asyncio
import json
import logging
import math
import os
from collections.abc import AsyncIterator, Mapping
from typing import Any

import httpx

from serve_app.catalog.config import CatalogModel, ExternalProvider
from serve_app.contract.chat import (
    GenerationDone,
    HeadEvent,
    HeadRequest,
    HeadStarted,
    TextDelta,
    ToolCallDelta,
)
from serve_app.contract.errors import HeadFailure
from serve_app.heads.external_request import (
    estimate_prompt_tokens,
    estimate_text_tokens,
    upstream_request,
    utf8_size,
)
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

    def __init__(
        self,
        model: CatalogModel,
        client: httpx.AsyncClient | None = None,
        environ: Mapping[str, str] | None = None,
    ) -> None:
        """``environ`` is where ``api_key_env`` is looked up (the process environment
        unless a test hands in its own)."""
        assert model.external is not None
        self.model_id = model.id
        self.provider: ExternalProvider = model.external
        self._environ = os.environ if environ is None else environ
        if not self._environ.get(self.provider.api_key_env):
            logger.warning(
                "external model %s: %s is not set; the provider will refuse its calls",
                model.id,
                self.provider.api_key_env,
            )
        self._client = client or httpx.AsyncClient(
            timeout=httpx.Timeout(self.provider.timeout_s, connect=10.0)
        )

    @property
    def base_url(self) -> str:
        """``base_url``, or the value of ``base_url_env`` where that is set."""
        env = self.provider.base_url_env
        return (self._environ.get(env) if env else None) or self.provider.base_url

    async def stream(self, request: HeadRequest) -> AsyncIterator[HeadEvent]:
        upstream = upstream_request(request, self.provider.upstream_model)
        prompt_estimate = estimate_prompt_tokens(request.prompts)
        yield HeadStarted(
            prompt_tokens=prompt_estimate,
            max_tokens=request.max_tokens or request.max_output_tokens,
            ignored_params=upstream.ignored,
        )
        try:
            async with self._open(upstream.path, upstream.body) as response:
                async for event in _events(response, self.model_id, prompt_estimate):
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
        except Exception:  # a provider that answers something we cannot read: its failure
            logger.exception("external %s sent an unreadable answer", self.model_id)
            yield HeadFailure.from_error(
                UpstreamError(f"The provider of '{self.model_id}' sent an unreadable answer.")
            )

    def _open(self, path: str, body: dict[str, Any]) -> _UpstreamCall:
        return _UpstreamCall(self, path, body)

    async def send(self, path: str, body: dict[str, Any]) -> httpx.Response:
        """POST with retries limited to the cases where nothing was generated."""
        headers = {"Authorization": f"Bearer {self._environ.get(self.provider.api_key_env, '')}"}
        url = self.base_url.rstrip("/") + path
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
            body = await read_capped(response, _ERROR_BODY_BYTES)
            await response.aclose()
            raise upstream_status_error(
                response.status_code, response.headers, body, self._client.model_id
            )
        return response

    async def __aexit__(self, *exc: object) -> None:
        if self._response is not None:
            await self._response.aclose()


# 400 codes of our vocabulary (docs/reference/common.md#error-codes) a provider's refusal may carry
# through.
_RELAYED_400_CODES = frozenset(
    {"context_length_exceeded", "invalid_value", "invalid_image", "unsupported_parameter"}
)


_ERROR_BODY_BYTES = 64 * 1024
"""How much of a provider's error body is read: enough for any message, never a flood."""
_WHOLE_BODY_BYTES = 32 * 1024 * 1024
"""Cap on a provider's non-streamed (JSON) answer."""


async def read_capped(response: httpx.Response, limit: int) -> bytes:
    """At most ``limit`` bytes of a streamed response body (the rest is not read)."""
    body = bytearray()
    async for chunk in response.aiter_bytes():
        body.extend(chunk)
        if len(body) >= limit:
            break
    return bytes(body[:limit])


def upstream_status_error(
    status: int, headers: httpx.Headers, body: bytes, model_id: str
) -> GatewayError:
    """Map a provider's error status to ours (docs/reference/common.md#error-codes: 502/503/504, or
    the client's 400)."""
    error = _error_object(body)
    message = _error_message(error, body, status)
    if status in (400, 404, 409, 413, 422):
        code, param = _refusal_code(error, message)
        return InvalidRequestError(
            f"The provider refused the request: {message}", code=code, param=param
        )
    if status in _RETRY_STATUSES:
        retry = {}
        if headers.get("retry-after", "").isdigit():
            retry["Retry-After"] = headers["retry-after"]
        return ModelUnavailableError(
            f"The provider of '{model_id}' is over capacity; retry shortly.", headers=retry
        )
    if status == 504:
        return UpstreamTimeoutError(f"The provider of '{model_id}' timed out.")
    return UpstreamError(f"The provider of '{model_id}' failed with status {status}.")


def _error_object(body: bytes) -> dict[str, Any]:
    """The provider's ``error`` object, or ``{}`` when the body is not the usual envelope."""
    try:
        data = json.loads(body)
    except ValueError:  # not JSON, not UTF-8, or cut off by the read cap
        return {}
    error = data.get("error") if isinstance(data, dict) else None
    return error if isinstance(error, dict) else {}


def _error_message(error: dict[str, Any], body: bytes, status: int) -> str:
    message = error.get("message")
    if isinstance(message, str) and message:
        return _clean(message)[:500]
    text = body[:2000].decode("utf-8", "replace").strip()
    return _clean(text)[:500] or f"status {status}"


def _refusal_code(error: dict[str, Any], message: str) -> tuple[str | None, str | None]:
    """Our code and param for a provider's refusal: its own when they are ours to use."""
    code = error.get("code")
    param = error.get("param")
    if code not in _RELAYED_400_CODES:
        code = None
        if "context length" in message.lower() or "context window" in message.lower():
            code = "context_length_exceeded"
    return code, _clean(param)[:200] if isinstance(param, str) and param else None


def _clean(text: str) -> str:
    """Provider text made safe to re-encode (a lone surrogate would break our answer)."""
    return text.encode("utf-8", "replace").decode("utf-8")


class _OwnCount:
    """The gateway's own count of what a provider generated, per choice: its deltas (a
    token each at least) and the UTF-8 bytes of its text, reasoning and tool calls."""

    def __init__(self) -> None:
        self.deltas: dict[int, int] = {}
        self.sizes: dict[int, int] = {}

    def add(self, index: int, *texts: str) -> None:
        if any(texts):
            self.deltas[index] = self.deltas.get(index, 0) + 1
        self.sizes[index] = self.sizes.get(index, 0) + sum(utf8_size(t) for t in texts)

    def tokens(self, index: int) -> int:
        """Tokens of one choice so far: the larger of its deltas and its bytes' estimate."""
        return max(self.deltas.get(index, 0), estimate_text_tokens(self.sizes.get(index, 0)))

    def total(self) -> int:
        return sum(self.tokens(index) for index in self.sizes)


async def _events(
    response: httpx.Response, model_id: str, prompt_estimate: int
) -> AsyncIterator[HeadEvent]:
    """Provider SSE chunks -> head events; tool-call fragments are joined per call.

    A provider that ignores ``stream: true`` and answers one JSON body is read as
    a stream of one chunk. Anything else that is not the chunk format is the
    provider's failure (502), never ours (500). The last event is the usage: the
    provider's where it is usable, else the gateway's own count (``_settled``).
    """
    counted = _OwnCount()
    calls: dict[tuple[int, int], dict[str, str]] = {}
    reported: dict[str, Any] | None = None
    media_type = response.headers.get("content-type", "").split(";")[0].strip().lower()
    if media_type == "application/json":
        whole = await read_capped(response, _WHOLE_BODY_BYTES)
        text = whole.decode("utf-8", "replace")
        chunks: AsyncIterator[dict[str, Any]] = _single(_as_chunk(text, model_id))
    else:
        chunks = _sse_chunks(response, model_id)
    async for chunk in chunks:
        error = chunk.get("error")
        if error is not None:
            detail = error.get("message") if isinstance(error, dict) else error
            raise UpstreamError(f"The provider failed mid-stream: {_clean(str(detail))[:500]}")
        if isinstance(chunk.get("usage"), dict):
            reported = chunk["usage"]
        choices = chunk.get("choices")
        for choice in choices if isinstance(choices, list) else []:
            delta = _delta(choice, counted, calls) if isinstance(choice, dict) else None
            if delta is not None:
                yield delta
    yield _settled(reported or {}, counted, prompt_estimate)


async def _sse_chunks(response: httpx.Response, model_id: str) -> AsyncIterator[dict[str, Any]]:
    async for line in response.aiter_lines():
        if not line.startswith("data:"):
            continue  # comments (": ping"), event names, blank separators
        data = line[len("data:") :].strip()
        if data == "[DONE]":
            return
        yield _as_chunk(data, model_id)


async def _single(chunk: dict[str, Any]) -> AsyncIterator[dict[str, Any]]:
    """A whole (non-streamed) completion as the one chunk it amounts to."""
    choices = chunk.get("choices")
    for choice in choices if isinstance(choices, list) else []:
        message = choice.get("message") if isinstance(choice, dict) else None
        if isinstance(message, dict) and "delta" not in choice:
            calls = message.get("tool_calls")
            if isinstance(calls, list):  # whole calls carry no index; number them in order
                message["tool_calls"] = [
                    {**call, "index": i} if isinstance(call, dict) else call
                    for i, call in enumerate(calls)
                ]
            choice["delta"] = message
    yield chunk


def _as_chunk(data: str, model_id: str) -> dict[str, Any]:
    try:
        chunk = json.loads(data)
    except ValueError:
        raise UpstreamError(f"The provider of '{model_id}' sent a malformed event.") from None
    if not isinstance(chunk, dict):
        raise UpstreamError(f"The provider of '{model_id}' sent a malformed event.")
    return chunk


def _delta(
    choice: dict[str, Any], counted: _OwnCount, calls: dict[tuple[int, int], dict[str, str]]
) -> TextDelta | None:
    index = _index(choice.get("index"))
    delta = choice.get("delta")
    delta = delta if isinstance(delta, dict) else {}
    text = _text(delta.get("content")) or _text(choice.get("text"))
    reasoning = _text(delta.get("reasoning_content")) or _text(delta.get("reasoning"))
    parts = delta.get("tool_calls")
    for part in parts if isinstance(parts, list) else []:
        if not isinstance(part, dict):
            continue
        slot = calls.setdefault((index, _index(part.get("index"))), {"name": "", "arguments": ""})
        slot["id"] = _text(part.get("id")) or slot.get("id", "")
        function = part.get("function")
        function = function if isinstance(function, dict) else {}
        name, arguments = _text(function.get("name")), _text(function.get("arguments"))
        slot["name"] += name
        slot["arguments"] += arguments
        counted.add(index, name, arguments)
    finish = choice.get("finish_reason")
    finish = _text(finish) or None
    counted.add(index, text, reasoning)
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
        completion_tokens=counted.tokens(index),
    )


def _index(value: Any) -> int:
    """A choice or tool-call index; anything that is not a small non-negative int is 0."""
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else 0


def _text(value: Any) -> str:
    return _clean(value) if isinstance(value, str) else ""


_MAX_COUNT = 2**31 - 1


def _count(value: Any) -> int | None:
    """A provider's token count, or None when it is not a number we can bill."""
    if isinstance(value, bool):
        return None
    if isinstance(value, float) and math.isfinite(value):
        value = int(value)
    if not isinstance(value, int):
        return None
    return min(max(0, value), _MAX_COUNT)


def _settled(usage: dict[str, Any], counted: _OwnCount, prompt_estimate: int) -> GenerationDone:
    """The usage a call is billed at: the provider's counts where they can be billed, the
    gateway's own (``prompt_estimate``, ``counted``) where they are missing, not numbers, or
    0 for something that was there (a prompt is never empty; generated text is never free).
    """
    prompt_details = usage.get("prompt_tokens_details")
    completion_details = usage.get("completion_tokens_details")
    cached = prompt_details.get("cached_tokens") if isinstance(prompt_details, dict) else None
    reasoning = (
        completion_details.get("reasoning_tokens") if isinstance(completion_details, dict) else None
    )
    own_completion = counted.total()
    completion = _count(usage.get("completion_tokens"))
    if completion is None or (completion == 0 and own_completion > 0):
        completion = own_completion
    return GenerationDone(
        prompt_tokens=_count(usage.get("prompt_tokens")) or prompt_estimate,
        completion_tokens=completion,
        cached_tokens=_count(cached),
        reasoning_tokens=_count(reasoning),
    )
