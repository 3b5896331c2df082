"""HTTP GET of model-chosen URLs under hostile-input rules (``web_fetch``).

A URL written by a model is attacker-controlled input: it may name the
gateway's own services or the cloud metadata endpoint, in forms a simple
string check misses (``[::1]``, ``2130706433``, ``0x7f.1``, ``::ffff:127.0.0.1``,
a public DNS name that resolves to 127.0.0.1, a redirect to any of these).
So every hop is resolved first, *every* address it resolves to must be public
(addresses embedded in IPv6 forms are unwrapped and checked too), and the
connection goes to the vetted address itself (pinned: DNS cannot change
between check and use), with the original name kept for Host and TLS (SNI and
certificate check). Bodies are read under a byte cap and the whole fetch,
redirects included, under one deadline.
"""

from __future__ import annotations

import asyncio
import ipaddress
import socket
from collections.abc import Callable
from dataclasses import dataclass
from urllib.parse import urljoin, urlsplit

import httpx

from serve_app.inference.images import is_public_address

_NAT64 = (ipaddress.ip_network("64:ff9b::/96"), ipaddress.ip_network("64:ff9b:1::/48"))
_USER_AGENT = "inference-gateway-web-fetch/1.0"


class FetchError(Exception):
    """The fetch did not produce a page; the message is safe to show the model."""


@dataclass
class FetchedPage:
    url: str
    status: int
    content_type: str
    body: bytes


def is_public_target(address: str) -> bool:
    """True only for addresses that are, and do not embed, a non-public address."""
    try:
        ip = ipaddress.ip_address(address.split("%", 1)[0])
    except ValueError:
        return False
    if isinstance(ip, ipaddress.IPv6Address):
        embedded = _embedded_ipv4(ip)
        if embedded is False:
            return False
        if embedded is not None and not is_public_address(str(embedded)):
            return False
    return is_public_address(str(ip))


def _embedded_ipv4(ip: ipaddress.IPv6Address) -> ipaddress.IPv4Address | bool | None:
    """The IPv4 address an IPv6 form carries; False for the deprecated ``::a.b.c.d``."""
    if ip.ipv4_mapped is not None:
        return ip.ipv4_mapped
    if ip.sixtofour is not None:
        return ip.sixtofour
    if ip.teredo is not None:
        return ip.teredo[1]
    if any(ip in net for net in _NAT64):
        return ipaddress.IPv4Address(int(ip) & 0xFFFFFFFF)
    if int(ip) >> 32 == 0:
        return False  # IPv4-compatible (::/96): deprecated, never a real target
    return None


class SafeFetcher:
    """GETs one URL; a refusal or failure raises ``FetchError``."""

    def __init__(
        self,
        *,
        timeout_s: float,
        max_bytes: int,
        max_redirects: int,
        allow_private_hosts: bool = False,
        address_allowed: Callable[[str], bool] | None = None,
    ) -> None:
        self.timeout_s = timeout_s
        self.max_bytes = max_bytes
        self.max_redirects = max_redirects
        # The guard every resolved address of every hop must pass.
        self.address_allowed = address_allowed or (
            (lambda _: True) if allow_private_hosts else is_public_target
        )

    async def get(self, url: str) -> FetchedPage:
        try:
            async with asyncio.timeout(self.timeout_s):
                return await self._follow(url)
        except TimeoutError:
            raise FetchError(f"fetching {url} timed out after {self.timeout_s:g} s") from None
        except httpx.HTTPError as err:
            raise FetchError(f"fetching {url} failed ({type(err).__name__})") from None

    async def _follow(self, url: str) -> FetchedPage:
        async with httpx.AsyncClient(follow_redirects=False, trust_env=False) as client:
            for _ in range(self.max_redirects + 1):
                result = await self._hop(client, url)
                if isinstance(result, FetchedPage):
                    return result
                url = result
        raise FetchError("too many redirects")

    async def _hop(self, client: httpx.AsyncClient, url: str) -> FetchedPage | str:
        """One request to a vetted, pinned address; a redirect returns the next URL."""
        parts = urlsplit(url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise FetchError("only http(s) URLs with a host can be fetched")
        port = parts.port or (443 if parts.scheme == "https" else 80)
        address = await self._vetted_address(parts.hostname, port)
        host_for_url = f"[{address}]" if ":" in address else address
        pinned = parts._replace(netloc=f"{host_for_url}:{port}").geturl()
        headers = {
            "Host": parts.netloc.rsplit("@", 1)[-1],
            "User-Agent": _USER_AGENT,
            "Accept": "text/html,text/plain,application/json;q=0.9,*/*;q=0.5",
        }
        extensions = {"sni_hostname": parts.hostname} if parts.scheme == "https" else {}
        request = client.build_request("GET", pinned, headers=headers, extensions=extensions)
        response = await client.send(request, stream=True)
        try:
            if response.is_redirect and "location" in response.headers:
                return urljoin(url, response.headers["location"])
            body = await self._read_capped(response)
            content_type = response.headers.get("content-type", "")
            return FetchedPage(url, response.status_code, content_type, body)
        finally:
            await response.aclose()

    async def _read_capped(self, response: httpx.Response) -> bytes:
        body = bytearray()
        async for chunk in response.aiter_bytes():
            body.extend(chunk)
            if len(body) > self.max_bytes:
                del body[self.max_bytes :]
                break  # a page is useful truncated; stop reading the rest
        return bytes(body)

    async def _vetted_address(self, host: str, port: int) -> str:
        loop = asyncio.get_running_loop()
        try:
            infos = await loop.getaddrinfo(host, port, type=socket.SOCK_STREAM)
        except (socket.gaierror, UnicodeError):
            raise FetchError(f"the host '{host}' does not resolve") from None
        addresses = [str(info[4][0]) for info in infos]
        if not addresses:
            raise FetchError(f"the host '{host}' does not resolve")
        if not all(self.address_allowed(a) for a in addresses):
            raise FetchError(f"the host '{host}' is not a public address")
        return addresses[0]
