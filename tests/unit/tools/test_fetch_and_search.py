"""web_fetch's SSRF guard and limits, and the search providers, against loopback servers."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from serve_app.outbound import is_public_address
from serve_app.tools.config import WebSearchOptions
from serve_app.tools.safe_fetch import FetchError, SafeFetcher
from serve_app.tools.search import (
    BraveProvider,
    DisabledSearchProvider,
    SearchError,
    SearxngProvider,
)
from serve_app.tools.webpage import page_text
from tests.fixtures.tool_servers import LocalWeb


def fetcher(
    allow_private: bool = False, allowed: Callable[[str], bool] | None = None, **limits: float
) -> SafeFetcher:
    return SafeFetcher(
        timeout_s=limits.get("timeout_s", 15.0),
        max_bytes=int(limits.get("max_bytes", 1_000_000)),
        max_redirects=3,
        allow_private_hosts=allow_private,
        address_allowed=allowed,
    )


@pytest.mark.parametrize(
    "address",
    [
        "127.0.0.1",
        "::1",
        "10.1.2.3",
        "172.16.0.1",
        "192.168.1.1",
        "169.254.169.254",
        "100.64.0.1",
        "0.0.0.0",
        "fe80::1",
        "fc00::1",
        "::ffff:127.0.0.1",  # IPv4-mapped
        "::127.0.0.1",  # IPv4-compatible
        "2002:7f00:1::",  # 6to4 around 127.0.0.1
        "64:ff9b::a9fe:a9fe",  # NAT64 around 169.254.169.254
        "224.0.0.1",
        "not-an-ip",
    ],
)
def test_non_public_addresses_are_refused(address: str) -> None:
    assert not is_public_address(address)


@pytest.mark.parametrize("address", ["93.184.216.34", "2606:4700:4700::1111", "1.1.1.1"])
def test_public_addresses_pass(address: str) -> None:
    assert is_public_address(address)


@pytest.mark.parametrize(
    "url",
    [
        "http://127.0.0.1:{port}/page/1",
        "http://localhost:{port}/page/1",  # a name that resolves to loopback
        "http://[::1]:{port}/page/1",
        "http://2130706433:{port}/page/1",  # 127.0.0.1 written as one decimal number
        "http://0x7f.0.0.1:{port}/page/1",
        "http://127.1:{port}/page/1",
        "http://[::ffff:127.0.0.1]:{port}/page/1",
        "http://0x7f000001:{port}/page/1",  # one hexadecimal number
        "http://017700000001:{port}/page/1",  # one octal number
        "http://0177.0.0.1:{port}/page/1",
        "http://127.000.000.001:{port}/page/1",
        "http://[0:0:0:0:0:ffff:7f00:1]:{port}/page/1",
        "http://[::]:{port}/page/1",  # the unspecified address reaches local services
        "http://0:{port}/page/1",
        "http://0.0.0.0:{port}/page/1",
        "http://LOCALHOST:{port}/page/1",
        "http://localhost.:{port}/page/1",  # fully qualified form
        "http://public.example@127.0.0.1:{port}/page/1",  # userinfo that looks like a host
    ],
)
async def test_guard_refuses_loopback_in_every_spelling(local_web: LocalWeb, url: str) -> None:
    with pytest.raises(FetchError):
        await fetcher().get(url.format(port=local_web.port))
    assert local_web.requests == []  # nothing reached the server


async def test_every_redirect_hop_is_checked(local_web: LocalWeb) -> None:
    """First hop allowed (only 127.0.0.1 itself), the redirect to [::1] is refused."""
    only_first = fetcher(allowed=lambda address: address == "127.0.0.1")
    target = f"http://[::1]:{local_web.port}/page/2"
    with pytest.raises(FetchError, match="not a public address"):
        await only_first.get(f"{local_web.base_url}/redirect?to={target}")
    assert [path for path, _, _ in local_web.requests] == ["/redirect"]


@pytest.mark.parametrize(
    "target",
    [
        "http://127.0.0.1:{port}/page/1",
        "http://2130706433:{port}/page/1",
        "http://[::ffff:127.0.0.1]:{port}/page/1",
        "http://localhost:{port}/page/1",
        "http://[::1]:{port}/page/1",
    ],
)
async def test_redirect_from_a_public_site_to_loopback_is_refused(
    local_web: LocalWeb, target: str
) -> None:
    """127.0.0.2 plays the public site (the guard allows only it); the service on
    127.0.0.1 plays the gateway's neighbour that the redirect tries to reach."""
    public = LocalWeb(host="127.0.0.2")
    try:
        guard = fetcher(allowed=lambda address: address == "127.0.0.2")
        page = await guard.get(f"{public.base_url}/redirect?to={public.base_url}/page/4")
        assert b"Page 4." in page.body  # the allowed site itself is fetched, redirects too
        with pytest.raises(FetchError, match=r"not a public address|does not resolve"):
            location = target.format(port=local_web.port)
            await guard.get(f"{public.base_url}/redirect?to={location}")
        assert local_web.requests == []  # nothing reached the neighbour
    finally:
        public.close()


async def test_fetch_follows_redirects_and_extracts_text(local_web: LocalWeb) -> None:
    page = await fetcher(allow_private=True).get(f"{local_web.base_url}/redirect?to=/page/7")
    title, text = page_text(page, 10_000)
    assert title == "Paris facts"
    assert "Paris is the capital of France." in text and "Page 7." in text
    assert "secret" not in text and "color" not in text  # scripts and styles dropped


async def test_fetch_size_and_time_limits(local_web: LocalWeb) -> None:
    page = await fetcher(allow_private=True, max_bytes=10_000).get(f"{local_web.base_url}/big")
    assert len(page.body) == 10_000
    _, text = page_text(page, 500)
    assert text.endswith("[truncated]") and len(text) < 520
    with pytest.raises(FetchError, match="timed out"):
        await fetcher(allow_private=True, timeout_s=0.5).get(f"{local_web.base_url}/slow?s=3")


async def test_non_text_and_error_pages_are_failures(local_web: LocalWeb) -> None:
    binary = await fetcher(allow_private=True).get(f"{local_web.base_url}/binary")
    with pytest.raises(FetchError, match="image/png"):
        page_text(binary, 1000)
    missing = await fetcher(allow_private=True).get(f"{local_web.base_url}/nothing")
    with pytest.raises(FetchError, match="404"):
        page_text(missing, 1000)
    with pytest.raises(FetchError):
        await fetcher(allow_private=True).get("file:///etc/passwd")


async def test_searxng_provider(local_web: LocalWeb) -> None:
    provider = SearxngProvider(WebSearchOptions(provider="searxng", url=local_web.base_url))
    hits = await provider.search("capital of france", 3)
    assert [h.title for h in hits] == ["Result 1", "Result 2", "Result 3"]
    assert hits[0].url == f"{local_web.base_url}/page/1" and hits[0].snippet == "Snippet 1"
    assert local_web.searches() == ["capital of france"]
    local_web.fail_searches(503)
    with pytest.raises(SearchError, match="503"):
        await provider.search("again", 3)


async def test_brave_provider_sends_the_key(local_web: LocalWeb) -> None:
    options = WebSearchOptions(
        provider="brave", url=f"{local_web.base_url}/brave", api_key_env="TEST_BRAVE_KEY"
    )
    hits = await BraveProvider(options, environ={"TEST_BRAVE_KEY": "brave-key"}).search("q", 8)
    assert len(hits) == 8 and hits[0].snippet == "D1"
    headers = {k.lower(): v for k, v in local_web.requests[-1][2].items()}
    assert headers["x-subscription-token"] == "brave-key"


async def test_unreachable_and_unconfigured_providers_fail_cleanly() -> None:
    dead = SearxngProvider(WebSearchOptions(provider="searxng", url="http://127.0.0.1:9"))
    with pytest.raises(SearchError, match="unreachable"):
        await dead.search("q", 3)
    with pytest.raises(SearchError, match="not configured"):
        await DisabledSearchProvider().search("q", 3)
