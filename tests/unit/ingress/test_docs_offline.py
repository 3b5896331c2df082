"""``/docs`` and ``/redoc`` load nothing from outside the gateway (issue 47, item 6)."""

from __future__ import annotations

import re
from html.parser import HTMLParser

import pytest

from tests.fixtures.gateway import GatewayHarness


class _Links(HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.urls: list[str] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.urls += [v for k, v in attrs if k in ("src", "href") and v]


@pytest.mark.parametrize("page", ["/docs", "/redoc"])
async def test_the_docs_pages_use_only_the_gateway_s_own_files(
    sync_gateway: GatewayHarness, page: str
) -> None:
    async with sync_gateway.client() as http:
        resp = await http.get(page)
        assert resp.status_code == 200
        parser = _Links()
        parser.feed(resp.text)
        assert parser.urls, "the page links its script and styles"
        # No absolute URL anywhere in the page: not in tags, not in the inline script.
        assert not re.search(r"(https?:)?//[a-z0-9.-]+\.[a-z]{2,}", resp.text, re.I), resp.text
        for url in parser.urls:
            assert url.startswith("/"), url
            asset = await http.get(url)
            assert asset.status_code == 200, url
            assert len(asset.content) > 1000, url
        openapi = await http.get("/openapi.json")
    assert openapi.status_code == 200


async def test_swagger_ui_is_version_5(sync_gateway: GatewayHarness) -> None:
    """Swagger UI 4 cannot render an OpenAPI 3.1 document, which FastAPI publishes."""
    async with sync_gateway.client() as http:
        js = await http.get("/docs/assets/swagger-ui-bundle.js")
        document = (await http.get("/openapi.json")).json()
    assert document["openapi"].startswith("3.1")
    assert re.search(rb'"5\.\d+\.\d+"', js.content)


async def test_the_new_routes_are_in_the_openapi_document(sync_gateway: GatewayHarness) -> None:
    async with sync_gateway.client() as http:
        paths = (await http.get("/openapi.json")).json()["paths"]
    for path in (
        "/api/session",
        "/api/session/org",
        "/api/session/password",
        "/api/session/oidc/start",
        "/api/session/oidc/callback",
        "/api/keys",
        "/api/keys/{key_id}",
        "/api/orgs/current",
        "/api/orgs/current/members",
        "/api/orgs/current/members/{user_id}",
        "/api/billing/usage",
        "/api/billing/usage.csv",
        "/api/billing/quotas",
        "/api/admin/ray-dashboard",
        "/dashboard/login/token",
    ):
        assert path in paths, path
