"""The one SSRF guard, exercised through both of its callers: image URLs and web_fetch.

Every hostile URL must be refused by each caller *before any connection*: the
loopback test server records every request it receives, and must see none.
Nothing here leaves loopback; 127.0.0.2 plays a public site where one is needed.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

import pytest

from serve_app.inference.images import ImageFetcher, ImagePolicy
from serve_app.outbound import LOOPBACK_FOR_TESTS_ENV, AddressGuard, is_public_address
from serve_app.protocol.errors import InvalidRequestError
from serve_app.tools.safe_fetch import FetchError, SafeFetcher
from tests.fixtures.tool_servers import LocalWeb

Allowed = Callable[[str], bool] | None
Caller = Callable[[str, Allowed], Awaitable[bytes]]


async def via_images(url: str, allowed: Allowed = None) -> bytes:
    uri = await ImageFetcher(ImagePolicy(address_allowed=allowed)).resolve(url, "p")
    return uri.encode()


async def via_web_fetch(url: str, allowed: Allowed = None) -> bytes:
    fetcher = SafeFetcher(timeout_s=10, max_bytes=100_000, max_redirects=3, address_allowed=allowed)
    return (await fetcher.get(url)).body


CALLERS: dict[str, Caller] = {"images": via_images, "web_fetch": via_web_fetch}
REFUSALS = (InvalidRequestError, FetchError)

HOSTILE = [
    "http://127.0.0.1:{port}/image",
    "http://127.1:{port}/image",
    "http://0x7f000001:{port}/image",
    "http://2130706433:{port}/image",
    "http://017700000001:{port}/image",
    "http://0x7f.0.0.1:{port}/image",
    "http://[::ffff:127.0.0.1]:{port}/image",
    "http://[0:0:0:0:0:ffff:7f00:1]:{port}/image",
    "http://[::1]:{port}/image",
    "http://[::]:{port}/image",
    "http://0.0.0.0:{port}/image",
    "http://0:{port}/image",
    "http://localhost:{port}/image",
    "http://LOCALHOST.:{port}/image",
    "http://public.example@127.0.0.1:{port}/image",
    "file:///etc/passwd",
    "file://127.0.0.1/etc/passwd",
    "gopher://127.0.0.1:{port}/_GET",
]


@pytest.fixture(scope="module")
def servers() -> Any:
    """One loopback "neighbour", one "public" site (127.0.0.2), one would-be proxy."""
    made = {name: LocalWeb(host=host) for name, host in _HOSTS.items()}
    yield made
    for web in made.values():
        web.close()


_HOSTS = {"local": "127.0.0.1", "public": "127.0.0.2", "proxy": "127.0.0.3"}


@pytest.fixture
def local_web(servers: dict[str, LocalWeb]) -> LocalWeb:
    for web in servers.values():
        web.requests.clear()
    return servers["local"]


@pytest.fixture(params=sorted(CALLERS))
def caller(request: pytest.FixtureRequest) -> Caller:
    return CALLERS[request.param]


@pytest.mark.parametrize("url", HOSTILE)
async def test_loopback_in_every_notation_is_refused_without_a_connection(
    caller: Caller, local_web: LocalWeb, url: str
) -> None:
    with pytest.raises(REFUSALS):
        await caller(url.format(port=local_web.port), None)
    assert local_web.requests == []


@pytest.mark.parametrize(
    "target",
    [
        "http://127.0.0.1:{port}/image",
        "http://2130706433:{port}/image",
        "http://[::ffff:127.0.0.1]:{port}/image",
        "http://[::1]:{port}/image",
        "http://localhost:{port}/image",
        "file:///etc/passwd",
    ],
)
async def test_a_redirect_to_loopback_is_refused(
    caller: Caller, local_web: LocalWeb, servers: dict[str, LocalWeb], target: str
) -> None:
    """127.0.0.2 plays the public site (the only address the guard admits)."""
    public = servers["public"]
    only_public: Allowed = lambda address: address == "127.0.0.2"  # noqa: E731
    assert await caller(f"{public.base_url}/redirect?to=/image", only_public)
    location = target.format(port=local_web.port)
    with pytest.raises(REFUSALS):
        await caller(f"{public.base_url}/redirect?to={location}", only_public)
    assert local_web.requests == []


async def test_proxy_variables_are_ignored(
    caller: Caller,
    local_web: LocalWeb,
    servers: dict[str, LocalWeb],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A proxy would resolve and connect on its own, past the guard: never used."""
    proxy = servers["proxy"]
    for name in ("HTTP_PROXY", "http_proxy", "ALL_PROXY", "all_proxy"):
        monkeypatch.setenv(name, proxy.base_url)
    monkeypatch.delenv("NO_PROXY", raising=False)
    monkeypatch.delenv("no_proxy", raising=False)
    only_target: Allowed = lambda address: address == "127.0.0.1"  # noqa: E731
    assert await caller(f"{local_web.base_url}/image", only_target)
    assert proxy.requests == []
    assert [path for path, _, _ in local_web.requests] == ["/image"]


async def test_the_loopback_test_setting_admits_loopback_only(
    caller: Caller, local_web: LocalWeb, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv(LOOPBACK_FOR_TESTS_ENV, raising=False)
    with pytest.raises(REFUSALS):
        await caller(f"{local_web.base_url}/image", None)
    monkeypatch.setenv(LOOPBACK_FOR_TESTS_ENV, "1")
    assert await caller(f"{local_web.base_url}/image", None)
    assert await caller(f"http://[::ffff:127.0.0.1]:{local_web.port}/image", None)
    assert len(local_web.requests) == 2


@pytest.mark.parametrize(
    "address",
    ["10.0.0.1", "169.254.169.254", "192.168.0.1", "fc00::1", "0.0.0.0", "::", "2002:a00:1::"],
)
def test_the_loopback_test_setting_never_admits_private_ranges(
    address: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(LOOPBACK_FOR_TESTS_ENV, "1")
    assert not AddressGuard().permits(address)
    assert AddressGuard().permits("127.0.0.5")


@pytest.mark.parametrize(
    ("address", "public"),
    [
        ("8.8.8.8", True),
        ("::ffff:8.8.8.8", True),
        ("2606:4700:4700::1111", True),
        ("::ffff:10.0.0.1", False),
        ("::127.0.0.1", False),  # IPv4-compatible
        ("2002:7f00:1::", False),  # 6to4 around 127.0.0.1
        ("64:ff9b::a9fe:a9fe", False),  # NAT64 around 169.254.169.254
        ("2001:0:4136:e378:8000:63bf:80ff:fffe", False),  # Teredo around 127.0.0.1
        ("100.64.0.1", False),
        ("224.0.0.1", False),
        ("fe80::1%eth0", False),
    ],
)
def test_embedded_ipv4_is_unwrapped(address: str, public: bool, **_: Any) -> None:
    assert is_public_address(address) is public
