"""OPTIONS answers every route, and every 405 names all of the path's methods (issue 16)."""

from __future__ import annotations

import pytest

from tests.fixtures.gateway import GatewayHarness


@pytest.mark.parametrize(
    ("path", "methods"),
    [
        ("/api/dedicated", "GET, HEAD, POST, OPTIONS"),
        ("/api/dedicated/ep_123", "GET, HEAD, PATCH, DELETE, OPTIONS"),
        ("/api/dedicated/rates", "GET, HEAD, OPTIONS"),  # the literal route wins
        ("/v1/video/generations", "GET, HEAD, POST, OPTIONS"),
        ("/v1/chat/completions", "POST, OPTIONS"),
    ],
)
async def test_options_lists_every_method_of_the_path(
    sync_gateway: GatewayHarness, path: str, methods: str
) -> None:
    async with sync_gateway.client() as http:
        answer = await http.options(path)
        assert (answer.status_code, answer.headers["allow"]) == (204, methods)
        # A method the path lacks: 405 with the same, complete Allow.
        refused = await http.put(path)
        assert refused.status_code == 405
        assert refused.headers["allow"] == methods


async def test_options_on_an_unknown_path_is_404(sync_gateway: GatewayHarness) -> None:
    async with sync_gateway.client() as http:
        assert (await http.options("/v1/nothing-here")).status_code == 404
