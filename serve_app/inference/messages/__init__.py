"""Anthropic's Messages API over the chat service: translation, answers, streams."""
