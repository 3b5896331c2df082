"""Images in chat messages: decode, fetch safely, identify by bytes (spec 2.4, 8).

Every image reaches the engine as a ``data:`` URI whose media type comes from
the bytes, never from what the client declared. Remote URLs are fetched by the
gateway itself under hostile-input rules: http(s) only, every resolved address
must be public (no loopback, private, link-local or reserved ranges, checked
again on each redirect and pinned for the connection so DNS cannot be swapped
between check and use), a size cap enforced while streaming, and a per-request
count cap.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import io
import ipaddress
import socket
from dataclasses import dataclass
from urllib.parse import SplitResult, urljoin, urlsplit

import httpx
from PIL import Image, UnidentifiedImageError

from serve_app.protocol.errors import InvalidRequestError

MAX_IMAGE_BYTES = 8 * 1024 * 1024
MAX_FETCHED_URLS = 8
_MAX_REDIRECTS = 3

# Magic numbers of the six accepted formats.
_SIGNATURES: tuple[tuple[bytes, str], ...] = (
    (b"\x89PNG\r\n\x1a\n", "png"),
    (b"\xff\xd8\xff", "jpeg"),
    (b"GIF87a", "gif"),
    (b"GIF89a", "gif"),
    (b"BM", "bmp"),
    (b"II*\x00", "tiff"),
    (b"MM\x00*", "tiff"),
)
_PIL_FORMATS = {"PNG": "png", "JPEG": "jpeg", "GIF": "gif", "WEBP": "webp", "BMP": "bmp"}
_PIL_FORMATS["TIFF"] = "tiff"


@dataclass(frozen=True)
class ImagePolicy:
    """Limits for image handling; tests may allow loopback hosts for a local server."""

    max_bytes: int = MAX_IMAGE_BYTES
    max_fetched_urls: int = MAX_FETCHED_URLS
    fetch_timeout_s: float = 10.0
    allow_private_hosts: bool = False


def sniff_format(data: bytes) -> str | None:
    """The format name from the leading bytes, or None when not an accepted one."""
    if data[:4] == b"RIFF" and data[8:12] == b"WEBP":
        return "webp"
    for signature, name in _SIGNATURES:
        if data.startswith(signature):
            return name
    return None


def validate_image_bytes(data: bytes, param: str, policy: ImagePolicy) -> str:
    """Return a normalized data URI, or raise ``invalid_image`` naming ``param``."""
    fmt = check_image_bytes(data, param, policy)
    return f"data:image/{fmt};base64,{base64.b64encode(data).decode('ascii')}"


def check_image_bytes(data: bytes, param: str, policy: ImagePolicy) -> str:
    """The format of an accepted image, or ``invalid_image`` naming ``param``.

    For callers that keep the bytes (document routes): no data URI is encoded.
    """
    if not data:
        raise _invalid(param, "the image is empty")
    if len(data) > policy.max_bytes:
        raise _invalid(param, f"the image is larger than {policy.max_bytes} bytes")
    fmt = sniff_format(data)
    if fmt is None:
        raise _invalid(param, "not a PNG, JPEG, GIF, WEBP, BMP or TIFF image")
    try:
        with Image.open(io.BytesIO(data)) as img:
            if _PIL_FORMATS.get(img.format or "") != fmt:
                raise _invalid(param, "the image bytes do not form a valid image")
            img.verify()
    except InvalidRequestError:
        raise
    except (UnidentifiedImageError, OSError, ValueError, SyntaxError, Image.DecompressionBombError):
        raise _invalid(param, "the image is corrupt or truncated") from None
    return fmt


def decode_data_uri(uri: str, param: str) -> bytes:
    """Bytes of a base64 ``data:`` URI; the declared media type is ignored."""
    header, sep, payload = uri.partition(",")
    if not sep or not header.startswith("data:") or ";base64" not in header:
        raise _invalid(param, "expected a base64 data URI (data:image/...;base64,...)")
    try:
        return base64.b64decode(payload, validate=True)
    except (binascii.Error, ValueError):
        raise _invalid(param, "the data URI is not valid base64") from None


class ImageFetcher:
    """Fetches remote images for one request, counting URLs against the cap."""

    def __init__(self, policy: ImagePolicy, client: httpx.AsyncClient | None = None) -> None:
        self.policy = policy
        self._client = client
        self.fetched = 0

    async def resolve(self, url: str, param: str) -> str:
        """A data URI for ``url`` (data: or http(s)), validated by bytes."""
        if url.startswith("data:"):
            return validate_image_bytes(decode_data_uri(url, param), param, self.policy)
        scheme = _split(url, param)[0].scheme.lower()
        if scheme not in ("http", "https"):
            raise _invalid(param, "image URLs must be data:, http: or https:")
        self.fetched += 1
        if self.fetched > self.policy.max_fetched_urls:
            raise _invalid(param, f"at most {self.policy.max_fetched_urls} image URLs per request")
        data = await self._fetch(url, param)
        return validate_image_bytes(data, param, self.policy)

    async def _fetch(self, url: str, param: str) -> bytes:
        try:
            async with asyncio.timeout(self.policy.fetch_timeout_s):
                return await self._fetch_following(url, param)
        except TimeoutError:
            raise _invalid(param, "fetching the image timed out") from None
        except (httpx.HTTPError, httpx.InvalidURL, ValueError) as err:
            # ValueError: a redirect to an unparseable Location, a host IDNA cannot encode.
            raise _invalid(
                param, f"the image could not be fetched ({type(err).__name__})"
            ) from None

    async def _fetch_following(self, url: str, param: str) -> bytes:
        client = self._client or httpx.AsyncClient(follow_redirects=False)
        try:
            for _ in range(_MAX_REDIRECTS + 1):
                response = await self._get_pinned(client, url, param)
                if response is None:
                    raise _invalid(param, "the image URL answered with an error")
                if isinstance(response, str):
                    url = response
                    continue
                return response
            raise _invalid(param, "too many redirects while fetching the image")
        finally:
            if self._client is None:
                await client.aclose()

    async def _get_pinned(
        self, client: httpx.AsyncClient, url: str, param: str
    ) -> bytes | str | None:
        """GET one hop on a vetted address; a redirect returns the next URL."""
        parts, explicit_port = _split(url, param)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise _invalid(param, "image URLs must be http(s) with a host")
        address = await self._public_address(parts.hostname, explicit_port, parts.scheme, param)
        port = explicit_port or (443 if parts.scheme == "https" else 80)
        host_for_url = f"[{address}]" if ":" in address else address
        pinned = parts._replace(netloc=f"{host_for_url}:{port}").geturl()
        headers = {"Host": parts.netloc.rsplit("@", 1)[-1], "Accept": "image/*"}
        extensions = {"sni_hostname": parts.hostname} if parts.scheme == "https" else {}
        request = client.build_request("GET", pinned, headers=headers, extensions=extensions)
        response = await client.send(request, stream=True)
        try:
            if response.is_redirect and "location" in response.headers:
                return urljoin(url, response.headers["location"])
            if response.status_code != 200:
                return None
            return await self._read_capped(response, param)
        finally:
            await response.aclose()

    async def _read_capped(self, response: httpx.Response, param: str) -> bytes:
        declared = response.headers.get("content-length")
        if declared and declared.isdigit() and int(declared) > self.policy.max_bytes:
            raise _invalid(param, f"the image is larger than {self.policy.max_bytes} bytes")
        body = bytearray()
        async for chunk in response.aiter_bytes():
            body.extend(chunk)
            if len(body) > self.policy.max_bytes:
                raise _invalid(param, f"the image is larger than {self.policy.max_bytes} bytes")
        return bytes(body)

    async def _public_address(self, host: str, port: int | None, scheme: str, param: str) -> str:
        loop = asyncio.get_running_loop()
        try:
            infos = await loop.getaddrinfo(
                host, port or (443 if scheme == "https" else 80), type=socket.SOCK_STREAM
            )
        except (socket.gaierror, UnicodeError, ValueError):
            raise _invalid(param, "the image host does not resolve") from None
        addresses = [str(info[4][0]) for info in infos]
        if not addresses:
            raise _invalid(param, "the image host does not resolve")
        if not self.policy.allow_private_hosts:
            for addr in addresses:
                if not is_public_address(addr):
                    raise _invalid(param, "image URLs may not point at private addresses")
        return addresses[0]


def _split(url: str, param: str) -> tuple[SplitResult, int | None]:
    """The URL's parts and explicit port; an unparseable URL (``http://[::1``, a port
    above 65535) is the caller's bad image, not a server error."""
    try:
        parts = urlsplit(url)
        return parts, parts.port
    except ValueError:
        raise _invalid(param, "the image URL is malformed") from None


def is_public_address(address: str) -> bool:
    """True only for globally routable unicast addresses."""
    try:
        ip = ipaddress.ip_address(address.split("%", 1)[0])
    except ValueError:
        return False
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        ip = ip.ipv4_mapped
    return ip.is_global and not (ip.is_multicast or ip.is_reserved or ip.is_loopback)


def _invalid(param: str, reason: str) -> InvalidRequestError:
    return InvalidRequestError(f"Invalid image: {reason}.", code="invalid_image", param=param)
