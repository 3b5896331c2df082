"""Split a streamed ``<think>...</think>`` block from the answer text.

Reasoning models that have no dedicated channel write their chain of thought
between think tags at the start of the answer. The gateway reports it in the
``reasoning`` field, so the split must work on a stream whose deltas can cut a
tag anywhere (``"<thi"`` + ``"nk>"``): text that might be the start of a tag is
held back until the next delta decides it, and released by ``flush``.

Only one leading block counts. Text that starts with anything but ``<think>``
is content, and so is a literal ``<think>`` appearing later in an answer: a
model quoting the tag must not lose the rest of its reply into reasoning.
Templates that open the block in the prompt (the generation prompt ends in
``<think>``) start the splitter inside reasoning.
"""

from __future__ import annotations

import enum

OPEN_TAG = "<think>"
CLOSE_TAG = "</think>"


class _State(enum.Enum):
    START = "start"  # nothing but whitespace seen: may still open a block
    REASONING = "reasoning"
    CONTENT = "content"


def _held_suffix(text: str, tag: str) -> int:
    """Length of the longest suffix of ``text`` that is a proper prefix of ``tag``."""
    for size in range(min(len(text), len(tag) - 1), 0, -1):
        if tag.startswith(text[-size:]):
            return size
    return 0


class ThinkTagSplitter:
    """Streaming splitter for one choice: ``feed`` deltas, ``flush`` at the end."""

    def __init__(self, *, in_reasoning: bool = False) -> None:
        self._state = _State.REASONING if in_reasoning else _State.START
        self._buffer = ""
        self._strip_content_start = False

    @property
    def in_reasoning(self) -> bool:
        """True while text goes to the reasoning channel (inside the block)."""
        return self._state is _State.REASONING

    def feed(self, text: str) -> tuple[str, str]:
        """Consume one delta; returns ``(reasoning, content)`` that can be emitted now."""
        self._buffer += text
        reasoning: list[str] = []
        content: list[str] = []
        while self._buffer:
            if self._state is _State.START and not self._decide_start():
                break
            if self._state is _State.REASONING:
                if not self._take_reasoning(reasoning):
                    break
                continue
            if self._state is _State.CONTENT:
                content.append(self._buffer)
                self._buffer = ""
        return "".join(reasoning), self._clean_content("".join(content))

    def flush(self) -> tuple[str, str]:
        """Release held-back text at the end of the stream, in the current channel."""
        rest, self._buffer = self._buffer, ""
        if self._state is _State.REASONING:
            return rest, ""
        return "", self._clean_content(rest)

    def _decide_start(self) -> bool:
        """In START: enter REASONING or CONTENT, or return False to wait for more text."""
        stripped = self._buffer.lstrip()
        if stripped.startswith(OPEN_TAG):
            self._buffer = stripped[len(OPEN_TAG) :]
            self._state = _State.REASONING
            return True
        if OPEN_TAG.startswith(stripped):  # empty, or a partial tag: wait
            return False
        self._state = _State.CONTENT
        return True

    def _take_reasoning(self, out: list[str]) -> bool:
        """Move reasoning text to ``out``; False when the rest must wait for more text."""
        index = self._buffer.find(CLOSE_TAG)
        if index >= 0:
            out.append(self._buffer[:index])
            self._buffer = self._buffer[index + len(CLOSE_TAG) :]
            self._state = _State.CONTENT
            self._strip_content_start = True
            return True
        held = _held_suffix(self._buffer, CLOSE_TAG)
        cut = len(self._buffer) - held
        out.append(self._buffer[:cut])
        self._buffer = self._buffer[cut:]
        return False

    def _clean_content(self, text: str) -> str:
        """Drop the blank lines models put between ``</think>`` and the answer."""
        if self._strip_content_start and text:
            text = text.lstrip()
            if text:
                self._strip_content_start = False
        return text
