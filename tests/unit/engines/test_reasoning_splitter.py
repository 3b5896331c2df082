"""The streaming think-tag splitter and the per-choice reasoning token accounting."""

from __future__ import annotations

import pytest

from deployments.engines.reasoning import ThinkTagSplitter
from deployments.engines.vllm_engine import ChoiceTracker

ANSWER = "<think>Paris is the capital.</think>\n\nThe capital is Paris."


def run(deltas: list[str], *, in_reasoning: bool = False) -> tuple[str, str]:
    """Feed ``deltas`` then flush; returns everything emitted as (reasoning, content)."""
    splitter = ThinkTagSplitter(in_reasoning=in_reasoning)
    reasoning, content = "", ""
    for delta in deltas:
        r, c = splitter.feed(delta)
        reasoning, content = reasoning + r, content + c
    r, c = splitter.flush()
    return reasoning + r, content + c


def test_whole_block_in_one_delta() -> None:
    assert run([ANSWER]) == ("Paris is the capital.", "The capital is Paris.")


@pytest.mark.parametrize("cut", range(1, len(ANSWER)))
def test_any_cut_point_gives_the_same_split(cut: int) -> None:
    assert run([ANSWER[:cut], ANSWER[cut:]]) == ("Paris is the capital.", "The capital is Paris.")


def test_one_character_deltas() -> None:
    assert run(list(ANSWER)) == ("Paris is the capital.", "The capital is Paris.")


def test_partial_tag_is_held_back_until_decided() -> None:
    splitter = ThinkTagSplitter()
    assert splitter.feed("<thi") == ("", "")
    assert splitter.feed("nk>abc</th") == ("abc", "")
    assert splitter.in_reasoning
    assert splitter.feed("ink>done") == ("", "done")
    assert not splitter.in_reasoning


def test_text_without_a_leading_block_is_all_content() -> None:
    text = "Use the <think> tag like this: <think>x</think>."
    assert run([text[:3], text[3:]]) == ("", text)


def test_lookalike_of_the_open_tag_is_released_as_content() -> None:
    splitter = ThinkTagSplitter()
    assert splitter.feed("<th") == ("", "")
    assert splitter.feed("e end>") == ("", "<the end>")


def test_leading_whitespace_before_the_block_is_allowed() -> None:
    assert run(["\n <think>r</think>c"]) == ("r", "c")


def test_unclosed_block_is_flushed_as_reasoning() -> None:
    assert run(["<think>still thinking</thi"]) == ("still thinking</thi", "")


def test_held_back_start_is_flushed_as_content() -> None:
    assert run(["<thi"]) == ("", "<thi")


def test_prompt_that_opened_the_block_starts_inside() -> None:
    assert run(["step one", "</think>\n\nanswer"], in_reasoning=True) == ("step one", "answer")


def test_only_whitespace_right_after_the_close_tag_is_dropped() -> None:
    assert run(["<think>r</think>", "\n", "\n", "a  b\n"]) == ("r", "a  b\n")


def test_tracker_counts_tag_and_reasoning_tokens_as_reasoning() -> None:
    tracker = ChoiceTracker(1, think_tags=True)
    deltas = [
        tracker.delta("<think>", 1, None),
        tracker.delta("hmm", 2, None),
        tracker.delta("</think>", 1, None),
        tracker.delta("\n\nYes", 2, None),
        tracker.delta(".", 1, "stop"),
    ]
    sent = [d for d in deltas if d is not None]
    assert "".join(d.reasoning for d in sent) == "hmm"
    assert "".join(d.text for d in sent) == "Yes."
    assert tracker.reasoning_tokens == 4
    assert tracker.completion_tokens == 7
    assert sent[-1].finish_reason == "stop"
    assert sent[-1].completion_tokens == 7
    assert {d.choice_index for d in sent} == {1}


def test_tracker_without_think_tags_passes_text_through() -> None:
    tracker = ChoiceTracker(0, think_tags=False)
    delta = tracker.delta("<think>x</think>", 3, None)
    assert delta is not None
    assert (delta.text, delta.reasoning) == ("<think>x</think>", "")
    assert tracker.reasoning_tokens == 0


def test_tracker_skips_empty_deltas_but_keeps_counting() -> None:
    tracker = ChoiceTracker(0, think_tags=False)
    assert tracker.delta("", 1, None) is None
    last = tracker.delta("", 1, "length")
    assert last is not None
    assert (last.finish_reason, last.completion_tokens) == ("length", 2)


def test_tracker_flushes_held_text_on_finish() -> None:
    tracker = ChoiceTracker(0, think_tags=True)
    assert tracker.delta("<thi", 1, None) is None
    last = tracker.delta("", 0, "length")
    assert last is not None
    assert (last.text, last.reasoning) == ("<thi", "")
