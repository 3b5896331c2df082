"""A scripted ``TextEngine`` for tests of the gateway's own logic.

It is not a model: it tokenizes on whitespace and answers from a script, so a
test can make it fail mid-stream, stall, reason, or call a tool, and assert on
what the gateway does with that. Directives are read from the last user
message:

- ``#fail-before``: raise before the first delta.
- ``#fail-after N``: raise after N deltas.
- ``#stall S``: sleep S seconds before answering.
- ``#tool NAME``: answer with one function call to NAME (with ``#chunks N`` streamed in
  N OpenAI-style fragments: same ``index``, only the first carries ``id`` and ``name``).
- ``#script [...]``: a JSON list of turns for tool-loop tests (see ``scripted_turns``).
- anything else: the reply is ``config["reply"]`` (default echoes the prompt).

With ``config["lora"]`` (``LoraSettings``) it serves LoRA adapters: ``load_adapter`` reads
the adapter's ``adapter_config.json`` (so a test sees the files reached the head) and a
reply generated with an adapter starts with ``[<adapter key>]`` (its unique id).

Text deltas carry chat-shaped logprobs when the request relays ``logprobs`` (the
engine config's ``extra_params`` must list it, as vLLM's heads do).
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from typing import Any

from deployments.chat.base import EngineEvent, EngineInfo, PreparedPrompt, TextEngine
from serve_app.contract.adapters import ADAPTER_CONFIG, BaseShapes, LoraSettings, base_shapes
from serve_app.contract.chat import (
    GenerationDone,
    PromptSpec,
    SamplingSpec,
    TextDelta,
    ToolCallDelta,
)
from tests.fakes.scripted_turns import (
    MARKER,
    fragments,
    pick_turn,
    play_turn,
    turn_number,
    word_logprobs,
)


class ScriptedEngineError(RuntimeError):
    """Raised on purpose by a directive."""


class ScriptedEngine(TextEngine):
    def __init__(self, config: dict[str, Any] | None = None) -> None:
        self.config = dict(config or {})
        self.max_model_len = int(self.config.get("max_model_len", 256))
        self.reasoning = str(self.config.get("reasoning", ""))
        self.vocab: dict[str, int] = {}
        self.words: list[str] = []
        self.aborted: list[str] = []
        self.seen: list[tuple[PromptSpec | None, SamplingSpec]] = []
        self.produced: dict[str, tuple[int, int]] = {}
        """The engine's own count per engine request id: (prompt tokens, completion tokens
        yielded so far), kept however the generation ends (tests compare the ledger to it)."""
        self.adapters: dict[str, dict[str, Any]] = {}
        """Loaded adapters: their unique id (the LoRA name) -> its adapter_config.json."""
        self.adapter_log: list[tuple[str, str]] = []
        """("load" | "unload", the adapter's unique id), in order."""

    def lora_settings(self) -> LoraSettings | None:
        raw = self.config.get("lora")
        return None if raw is None else LoraSettings.model_validate(raw)

    def adapter_base(self) -> BaseShapes | None:
        """``config["base"]`` (a Hugging Face config's sizes), else a tiny decoder: two
        layers, hidden and intermediate size 16 (``tests.fixtures.adapters``' default)."""
        default = {
            "hidden_size": 16,
            "intermediate_size": 16,
            "num_hidden_layers": 2,
            "num_attention_heads": 2,
        }
        return base_shapes(self.config.get("base", default))

    async def load_adapter(self, lora_name: str, path: str) -> None:
        if self.lora_settings() is None:
            await super().load_adapter(lora_name, path)
        with open(f"{path}/{ADAPTER_CONFIG}") as handle:
            self.adapters[lora_name] = json.load(handle)
        self.adapter_log.append(("load", lora_name))

    async def unload_adapter(self, lora_name: str) -> None:
        if self.adapters.pop(lora_name, None) is not None:
            self.adapter_log.append(("unload", lora_name))

    async def start(self) -> EngineInfo:
        return EngineInfo(
            max_model_len=self.max_model_len,
            separate_reasoning_channel=bool(self.reasoning),
            sampling_defaults=dict(self.config.get("sampling_defaults", {})),
        )

    def supported_extra_params(self) -> frozenset[str]:
        default = ["top_k", "min_p", "include_stop_str_in_output"]
        return frozenset(self.config.get("extra_params", default))

    def _ids(self, text: str) -> list[int]:
        ids = []
        for word in text.split():
            if word not in self.vocab:
                self.vocab[word] = len(self.words)
                self.words.append(word)
            ids.append(self.vocab[word])
        return ids

    async def prepare(
        self, prompt: PromptSpec, sampling: SamplingSpec | None = None
    ) -> PreparedPrompt:
        if prompt.kind == "chat":
            lines = []
            for m in prompt.messages or []:
                content = m.get("content")
                if isinstance(content, list):
                    content = " ".join(str(p.get("text", "<image>")) for p in content)
                lines.append(f"{m['role']}: {content or ''}")
            text = "\n".join(lines) + "\nassistant:"
        else:
            text = prompt.prompt or ""
        last = self._last_user(prompt)
        if prompt.adapter is not None and prompt.adapter not in self.adapters:
            raise ScriptedEngineError(f"adapter {prompt.adapter} is not loaded")
        payload = {"last": last, "prompt": prompt, "turn": turn_number(prompt)}
        return PreparedPrompt(token_ids=self._ids(text), payload=payload)

    @staticmethod
    def _last_user(prompt: PromptSpec) -> str:
        if prompt.kind == "completion":
            return prompt.prompt or ""
        for m in reversed(prompt.messages or []):
            if m.get("role") == "user" and isinstance(m.get("content"), str):
                return str(m["content"])
            if m.get("role") == "user" and isinstance(m.get("content"), list):
                return " ".join(str(p.get("text", "")) for p in m["content"])
        return ""

    async def generate(
        self,
        request_id: str,
        prompt: PreparedPrompt,
        sampling: SamplingSpec,
        *,
        stream: bool = True,
    ) -> AsyncIterator[EngineEvent]:
        last: str = prompt.payload["last"]
        self.seen.append((prompt.payload["prompt"], sampling))
        per_choice: dict[int, int] = {}
        self.produced[request_id] = (prompt.num_tokens, 0)
        try:
            async for event in self._script(request_id, last, prompt, sampling):
                if isinstance(event, TextDelta):
                    seen = per_choice.get(event.choice_index, 0)
                    per_choice[event.choice_index] = max(seen, event.completion_tokens)
                    self.produced[request_id] = (prompt.num_tokens, sum(per_choice.values()))
                yield event
        except (asyncio.CancelledError, GeneratorExit):
            self.aborted.append(request_id)
            raise

    async def _script(
        self, request_id: str, last: str, prompt: PreparedPrompt, sampling: SamplingSpec
    ) -> AsyncIterator[EngineEvent]:
        if MARKER in last:
            turn = pick_turn(last, prompt.payload["turn"])
            async for event in play_turn(turn, prompt.payload["turn"], prompt.num_tokens, sampling):
                yield event
            return
        words = last.split()
        if "#stall" in words:
            await asyncio.sleep(float(words[words.index("#stall") + 1]))
        if "#fail-before" in words:
            raise ScriptedEngineError("scripted failure before output")
        fail_after = int(words[words.index("#fail-after") + 1]) if "#fail-after" in words else None
        total = 0
        for choice in range(sampling.n):
            if "#tool" in words:
                call = ToolCallDelta(
                    id=f"call_{choice}",
                    name=words[words.index("#tool") + 1],
                    arguments=json.dumps({"q": "x"}),
                )
                chunks = int(words[words.index("#chunks") + 1]) if "#chunks" in words else 1
                pieces = fragments(call, chunks)
                for n, piece in enumerate(pieces, start=1):
                    yield TextDelta(
                        choice,
                        tool_calls=[piece],
                        finish_reason="tool_calls" if n == len(pieces) else None,
                        completion_tokens=n,
                    )
                total += len(pieces)
                continue
            produced = 0
            for word in self.reasoning.split():
                produced += 1
                yield TextDelta(choice, reasoning=word + " ", completion_tokens=produced)
            reply = str(self.config.get("reply", "")) or " ".join(words) or "ok"
            if adapter := prompt.payload["prompt"].adapter:
                reply = f"[{adapter}] {reply}"
            tokens = reply.split()
            stop_hit = any(s in tokens for s in sampling.stop)
            keep_stop = bool(sampling.extra.get("include_stop_str_in_output"))
            for i, word in enumerate(tokens):
                if word in sampling.stop and not keep_stop:
                    break
                if fail_after is not None and i >= fail_after:
                    raise ScriptedEngineError("scripted failure mid-stream")
                if produced >= sampling.max_tokens:
                    break
                produced += 1
                piece = (" " if i else "") + word
                yield TextDelta(
                    choice,
                    text=piece,
                    completion_tokens=produced,
                    logprobs=word_logprobs(piece, sampling),
                )
                if word in sampling.stop:
                    break  # vLLM's include_stop_str_in_output: the stop string, then the end
            finish = "length" if produced >= sampling.max_tokens and not stop_hit else "stop"
            yield TextDelta(choice, finish_reason=finish, completion_tokens=produced)
            total += produced
        yield GenerationDone(
            prompt_tokens=prompt.num_tokens,
            completion_tokens=total,
            reasoning_tokens=len(self.reasoning.split()) * sampling.n if self.reasoning else None,
        )

    async def abort(self, request_id: str) -> None:
        self.aborted.append(request_id)
