"""One GET of an outsider's URL: resolved, vetted, pinned, redirects re-checked.

Each hop: the scheme must be http(s) and the URL must name a host; the host is
resolved and *every* address it resolves to must pass the ``AddressGuard``
(one bad answer among good ones is how DNS rebinding slips through); the
connection then goes to the vetted address itself, so DNS cannot change
between check and use, with the original name kept for ``Host`` and for TLS
(SNI and the certificate check). Redirects are not followed by the HTTP client:
each ``Location`` is a new hop, checked the same way. The client never reads
proxy variables (``HTTP_PROXY``, ``ALL_PROXY``...: ``trust_env=False``), which
would otherwise hand the request to a proxy that resolves and connects on its
own. Userinfo in the URL is never sent. The body is read under a byte cap and
the whole fetch, redirects included, under one deadline.

The body is asked for uncompressed (``Accept-Encoding: identity``) and read as
the bytes on the wire, capped *before* any decoding: a server that compresses
anyway (``Content-Encoding: gzip`` or ``deflate``) is decoded here, in steps that
never produce more than the cap, so a few kilobytes of gzip bomb cannot inflate to
gigabytes in memory (the HTTP client's own decoder inflates each chunk whole). Any
other encoding (``br``, ``zstd``, stacked encodings) fails the fetch.
"""

from __future__ import annotations

import asyncio
import socket
import zlib
from dataclasses import dataclass
from typing import Literal
from urllib.parse import SplitResult, urljoin, urlsplit

import httpx

from serve_app.outbound.addresses import AddressGuard

FailureKind = Literal[
    "bad_url", "scheme", "unresolvable", "refused", "too_large", "redirects", "timeout", "failed"
]


class OutboundError(Exception):
    """The fetch produced no response; ``kind`` lets callers word their own error.

    The message is safe to show a client or a model (no internal address).
    """

    def __init__(self, kind: FailureKind, message: str) -> None:
        super().__init__(message)
        self.kind = kind


@dataclass(frozen=True)
class FetchLimits:
    """``oversize``: "truncate" keeps the first ``max_bytes`` (a web page is useful cut
    short), "refuse" fails the fetch (a cut image is a corrupt image)."""

    timeout_s: float
    max_bytes: int
    max_redirects: int
    oversize: Literal["truncate", "refuse"] = "refuse"
    accept: str = "*/*"
    user_agent: str = "inference-gateway/1.0"


@dataclass(frozen=True)
class OutboundResponse:
    url: str
    """The final URL, after redirects."""
    status: int
    content_type: str
    body: bytes


def split_url(url: str) -> tuple[SplitResult, int | None]:
    """The URL's parts and explicit port; a malformed URL is ``bad_url``."""
    try:
        parts = urlsplit(url)
        return parts, parts.port
    except ValueError:
        raise OutboundError("bad_url", "the URL is malformed") from None


async def safe_get(
    url: str,
    limits: FetchLimits,
    guard: AddressGuard,
    *,
    client: httpx.AsyncClient | None = None,
) -> OutboundResponse:
    """GET ``url`` under ``guard`` and ``limits``; any failure is ``OutboundError``.

    ``client`` (tests) must not follow redirects or trust the environment; by
    default a fresh client is made that does neither.
    """
    try:
        async with asyncio.timeout(limits.timeout_s):
            own = client is None
            http = client or httpx.AsyncClient(follow_redirects=False, trust_env=False)
            try:
                for _ in range(limits.max_redirects + 1):
                    result = await _hop(http, url, limits, guard)
                    if isinstance(result, OutboundResponse):
                        return result
                    url = result
            finally:
                if own:
                    await http.aclose()
            raise OutboundError("redirects", "too many redirects")
    except TimeoutError:
        raise OutboundError("timeout", f"timed out after {limits.timeout_s:g} s") from None
    except (httpx.HTTPError, httpx.InvalidURL, ValueError) as err:
        # ValueError: a Location that does not parse, a host IDNA cannot encode.
        raise OutboundError("failed", f"failed ({type(err).__name__})") from None


async def _hop(
    client: httpx.AsyncClient, url: str, limits: FetchLimits, guard: AddressGuard
) -> OutboundResponse | str:
    """One request to a vetted, pinned address; a redirect returns the next URL."""
    parts, explicit_port = split_url(url)
    if parts.scheme.lower() not in ("http", "https") or not parts.hostname:
        raise OutboundError("scheme", "only http(s) URLs with a host can be fetched")
    scheme = parts.scheme.lower()
    port = explicit_port or (443 if scheme == "https" else 80)
    address = await vetted_address(parts.hostname, port, guard)
    host_for_url = f"[{address}]" if ":" in address else address
    pinned = parts._replace(scheme=scheme, netloc=f"{host_for_url}:{port}").geturl()
    headers = {
        "Host": parts.netloc.rsplit("@", 1)[-1],
        "User-Agent": limits.user_agent,
        "Accept": limits.accept,
        "Accept-Encoding": "identity",
    }
    extensions = {"sni_hostname": parts.hostname} if scheme == "https" else {}
    request = client.build_request("GET", pinned, headers=headers, extensions=extensions)
    response = await client.send(request, stream=True, follow_redirects=False)
    try:
        if response.is_redirect and "location" in response.headers:
            return urljoin(url, response.headers["location"])
        body = await _read_capped(response, limits)
        content_type = response.headers.get("content-type", "")
        return OutboundResponse(url, response.status_code, content_type, body)
    finally:
        await response.aclose()


async def _read_capped(response: httpx.Response, limits: FetchLimits) -> bytes:
    """The body, at most ``max_bytes`` as sent and at most ``max_bytes`` decoded."""
    cap = limits.max_bytes
    declared = response.headers.get("content-length")
    refuse = limits.oversize == "refuse"
    if refuse and declared and declared.isdigit() and int(declared) > cap:
        raise _too_large(cap)
    decoder = _BodyDecoder(response.headers.get("content-encoding", ""), cap)
    received = 0
    async for chunk in response.aiter_raw():  # the bytes as sent: nothing inflated yet
        received += len(chunk)
        if received > cap:
            if refuse:
                raise _too_large(cap)
            chunk = chunk[: len(chunk) - (received - cap)]
        decoder.feed(chunk)
        if decoder.over:
            if refuse:
                raise _too_large(cap)
            break
        if received >= cap:
            break
    return decoder.body()


def _undecodable() -> OutboundError:
    return OutboundError("failed", "failed (the body does not decompress)")


def _too_large(cap: int) -> OutboundError:
    return OutboundError("too_large", f"the body is larger than {cap} bytes")


_WBITS = {"gzip": 16 + zlib.MAX_WBITS, "x-gzip": 16 + zlib.MAX_WBITS, "deflate": zlib.MAX_WBITS}
"""zlib's window setting per content coding we decode (gzip framing, zlib framing)."""


class _BodyDecoder:
    """Raw body bytes -> the body, holding at most ``cap + 1`` decoded bytes (``over``
    once there is more than ``cap``)."""

    def __init__(self, content_encoding: str, cap: int) -> None:
        codings = [c.strip().lower() for c in content_encoding.split(",")]
        codings = [c for c in codings if c and c != "identity"]
        if len(codings) > 1 or (codings and codings[0] not in _WBITS):
            raise OutboundError("failed", "failed (an unsupported content encoding)")
        self._coding = codings[0] if codings else None
        self._cap = cap
        self._out = bytearray()
        self._inflater = zlib.decompressobj(_WBITS[self._coding]) if self._coding else None
        self._started = False

    @property
    def over(self) -> bool:
        return len(self._out) > self._cap

    def body(self) -> bytes:
        return bytes(self._out[: self._cap])

    def feed(self, data: bytes) -> None:
        if self._inflater is None:
            self._out.extend(data[: self._cap + 1 - len(self._out)])
            return
        first, self._started = not self._started, True
        try:
            self._inflate(data)
            return
        except zlib.error:
            if self._coding != "deflate" or not first:
                raise _undecodable() from None
        # "deflate" is zlib-framed by the standard, raw deflate from some servers.
        self._inflater = zlib.decompressobj(-zlib.MAX_WBITS)
        try:
            self._inflate(data)
        except zlib.error:
            raise _undecodable() from None

    def _inflate(self, data: bytes) -> None:
        assert self._inflater is not None
        pending = data
        while pending and not self.over and not self._inflater.eof:
            # max_length bounds what one call may produce: the cap is never overshot.
            self._out.extend(self._inflater.decompress(pending, self._cap + 1 - len(self._out)))
            pending = self._inflater.unconsumed_tail


async def vetted_address(host: str, port: int, guard: AddressGuard) -> str:
    """The address to connect to: every address ``host`` resolves to must pass."""
    loop = asyncio.get_running_loop()
    try:
        infos = await loop.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except (socket.gaierror, UnicodeError, ValueError):
        raise OutboundError("unresolvable", f"the host '{host}' does not resolve") from None
    addresses = [str(info[4][0]) for info in infos]
    if not addresses:
        raise OutboundError("unresolvable", f"the host '{host}' does not resolve")
    if not all(guard.permits(a) for a in addresses):
        raise OutboundError("refused", f"the host '{host}' is not a public address")
    return addresses[0]
