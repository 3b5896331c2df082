"""``POST /v1/responses``: validate, open the first turn, run the loop, render
(docs/reference/responses.md#request).

Order of checks, as on chat: model (404, 403 external, 400 wrong route or a
``ded/`` alias), the body rules of 4.3 and the tools (400/403), input items
and images (400), then the head (errors before any output keep their real
status) and limits (429). Every request goes through the tool loop, which
with no server tool is a single turn. Once the response has started, a
failure of the model is no longer an HTTP error: it ends the response as
``incomplete`` (``upstream_error``, partial text billed) or ``failed``.
"""

from __future__ import annotations

import functools
import uuid
from collections.abc import AsyncIterator
from typing import Any

from serve_app.auth.principal import Principal
from serve_app.catalog.catalog import residency_routing
from serve_app.catalog.config import CatalogModel
from serve_app.config import ResponsesOptions
from serve_app.contract.chat import (
    GenerationDone,
    HeadRequest,
    HeadStarted,
    PromptSpec,
    SamplingSpec,
)
from serve_app.inference.answers import Answer, Body
from serve_app.inference.chat.assemble import answer_headers
from serve_app.inference.chat.service import TextService
from serve_app.inference.chat.tool_loop import (
    AnswerDelta,
    LoopEvent,
    ToolCallFinished,
    ToolCallStarted,
    ToolLoop,
)
from serve_app.inference.metering import MeteredRequest, RequestMeta
from serve_app.inference.responses.echo import response_settings
from serve_app.inference.responses.input import (
    check_request_rules,
    convert_input,
    convert_tool_choice,
    flatten_functions,
    reasoning_kwargs,
)
from serve_app.inference.responses.options import ResponseOptions, read_options
from serve_app.inference.responses.render import ResponseBuilder
from serve_app.inference.streams import MeteredStream, sse_stream
from serve_app.protocol.errors import GatewayError, InvalidRequestError
from serve_app.protocol.responses import ResponseSettings, ResponsesRequest
from serve_app.tools.declarations import (
    ServerToolPlan,
    build_plan,
    check_entitlements,
    check_name_clash,
    split_tools,
)
from serve_app.tools.guidance import equip_request
from serve_app.tools.runners import ToolBox, ToolRuntime


class _ResponsesRun:
    """One request through the loop, rendered as a Response or as named events."""

    def __init__(self, loop: ToolLoop, builder: ResponseBuilder, metered: MeteredRequest) -> None:
        self.builder = builder
        self.metered = metered
        self.stream: MeteredStream[LoopEvent] = MeteredStream(
            loop.run(), metered, label="responses stream"
        )

    def _frames_for(self, event: LoopEvent) -> list[bytes]:
        if isinstance(event, ToolCallStarted):
            return self.builder.tool_started(event.record)
        if isinstance(event, ToolCallFinished):
            return self.builder.tool_finished(event.record)
        if isinstance(event, AnswerDelta):
            return self.builder.delta(event.delta)
        return self.builder.finished(event.done, event.finish_reason)

    def _failed(self, err: GatewayError) -> list[bytes]:
        """After the response started, a failure ends it as incomplete or failed."""
        quantities = self.metered.usage.quantities(1)
        partial = GenerationDone(quantities.prompt_tokens, quantities.completion_tokens)
        return self.builder.failed(err, partial)

    def frames(self) -> AsyncIterator[bytes]:
        """``response.created`` ... one terminal event; no ``[DONE]``
        (docs/reference/responses.md#stream-events)."""
        return self.stream.relay(
            self._frames_for, opening=self.builder.created(), on_failure=self._failed
        )

    async def body(self) -> bytes:
        failure = await self.stream.drain(self._frames_for, keep_failure=True)
        if failure is not None:
            self._failed(failure)
        return self.builder.body()


class ResponsesService:
    """Serves ``POST /v1/responses`` on the chat heads, through the tool loop."""

    def __init__(
        self, text: TextService, runtime: ToolRuntime, options: ResponsesOptions | None = None
    ) -> None:
        self.text = text
        self.runtime = runtime
        self.options = options or ResponsesOptions()

    async def create(self, body: ResponsesRequest, principal: Principal) -> Answer:
        model = await self._resolve(body.model, principal)
        check_request_rules(body, model)
        options = read_options(body, model, structured_formats=self.options.structured_text_formats)
        kwargs = reasoning_kwargs(body, model)
        tool_choice = convert_tool_choice(body.tool_choice)
        functions, plan = self._tools(body, principal, model)
        messages = await convert_input(body, model, self.text.images)
        request = equip_request(
            self._head_request(body, model, messages, kwargs, options),
            plan,
            functions,
            tool_choice,
            search_scope=self.runtime.search_scope,
        )
        meta = RequestMeta(principal, model, "responses", request.request_id, 1)
        started, events, metered = await self.text.open_turn(meta, request)
        toolbox = (
            ToolBox(self.runtime, plan, action_sources=options.action_sources)
            if plan.declared
            else None
        )
        loop = ToolLoop(
            request=request,
            first_events=events,
            start_turn=functools.partial(self.text.start_turn, model),
            metered=metered,
            toolbox=toolbox,
            functions=functions,
            call_fragments=True,
        )
        settings = response_settings(
            body,
            model,
            functions=functions,
            plan=plan,
            tool_choice=tool_choice,
            options=options,
            max_output_tokens=started.max_tokens or None,
            engine_defaults=started.sampling_defaults,
        )
        run = _ResponsesRun(
            loop, _builder(body, model, request, settings, options, toolbox), metered
        )
        headers = answer_headers(_ignored(body, started, options), model)
        if not body.stream:
            return Body(await run.body(), headers)
        return sse_stream(run.stream, run.frames(), headers)

    async def _resolve(self, model_id: str, principal: Principal) -> CatalogModel:
        if model_id.startswith("ded/"):
            raise InvalidRequestError(
                "Dedicated endpoint aliases (ded/<slug>) are not served on /v1/responses; "
                "use /v1/chat/completions.",
                code="model_not_supported_for_endpoint",
                param="model",
            )
        return await self.text.resolve(model_id, principal)

    @staticmethod
    def _tools(
        body: ResponsesRequest, principal: Principal, model: CatalogModel
    ) -> tuple[list[dict[str, Any]], ServerToolPlan]:
        raw_functions, servers = split_tools(body.tools)
        indexes = [i for i, t in enumerate(body.tools or []) if t.get("type") == "function"]
        functions = flatten_functions(raw_functions, indexes)
        plan = build_plan(servers)
        check_entitlements(plan, principal, model)
        check_name_clash(functions, plan)
        return functions, plan

    @staticmethod
    def _head_request(
        body: ResponsesRequest,
        model: CatalogModel,
        messages: list[dict[str, Any]],
        template_kwargs: dict[str, Any],
        options: ResponseOptions,
    ) -> HeadRequest:
        prompt = PromptSpec(kind="chat", messages=messages, chat_template_kwargs=template_kwargs)
        sampling = SamplingSpec(
            max_tokens=0,  # sized by the head once the prompt is tokenized
            temperature=body.temperature,
            top_p=body.top_p,
            seed=body.seed,
            frequency_penalty=body.frequency_penalty,
            presence_penalty=body.presence_penalty,
            extra=options.sampling_extra(),
        )
        return HeadRequest(
            request_id=f"resp_{uuid.uuid4().hex}",
            prompts=[prompt],
            sampling=sampling,
            max_tokens=body.max_output_tokens,
            max_tokens_param="max_output_tokens",
            max_output_tokens=model.max_output_tokens or 0,
            prompt_param="input",
        )


def _builder(
    body: ResponsesRequest,
    model: CatalogModel,
    request: HeadRequest,
    settings: ResponseSettings,
    options: ResponseOptions,
    toolbox: ToolBox | None,
) -> ResponseBuilder:
    """The Response of this request as it starts, its ``routing`` stated for an external model."""
    builder = ResponseBuilder(
        request.request_id,
        model.id,
        body.metadata,
        settings=settings,
        separate_channel=model.reasoning.separate_channel,
        sources=toolbox.sources if toolbox is not None else None,
        logprobs=options.logprobs,
    )
    routing = residency_routing(model)
    if routing is not None:
        builder.response["routing"] = routing.model_dump(exclude_none=True)
    return builder


def _ignored(body: ResponsesRequest, started: HeadStarted, options: ResponseOptions) -> list[str]:
    """The parameters named in ``x-service-ignored-params``: the head's, then the route's."""
    ignored = list(started.ignored_params) + options.ignored
    if body.parallel_tool_calls is False:
        ignored.append("parallel_tool_calls")  # every call the model makes is returned
    return ignored
