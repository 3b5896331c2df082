"""Project-wide pytest configuration: fixture modules are registered as plugins here."""

from __future__ import annotations

import pytest

pytest_plugins = [
    "tests.fixtures.db",
    "tests.fixtures.gateway",
    "tests.fixtures.limits",
    "tests.fixtures.skip_budget",
    "tests.fixtures.tool_servers",
]


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Run the Ray Serve end-to-end tests last.

    Their session fixture keeps one Ray instance (and its GATEWAY_* environment)
    alive until the session ends, so unit tests that check "no Ray, default
    settings" must all have run before it starts. The sort is stable: the order
    inside each group is unchanged. The fault tests (they kill and replace parts of that
    instance) run after every other end-to-end test.
    """
    items.sort(
        key=lambda item: (
            "tests/serve/" in item.nodeid,
            item.get_closest_marker("fault") is not None,
        )
    )
