"""Images in chat messages: decode, fetch safely, identify by bytes
(docs/reference/chat.md#messages, docs/reference/common.md#limits).

Every image reaches the engine as a ``data:`` URI whose media type comes from
the bytes, never from what the client declared. Remote URLs are fetched by the
gateway itself through the one outbound guard (``serve_app.outbound``, shared
with ``web_fetch``): http(s) only, every resolved address public (embedded IPv4
unwrapped), checked again on each redirect and pinned for the connection so DNS
cannot be swapped between check and use, proxy variables ignored, a size cap
enforced while streaming, and a per-request count cap.
"""

from __future__ import annotations

import base64
import binascii
import io
from collections.abc import Callable
from dataclasses import dataclass
from urllib.parse import SplitResult, urlsplit

import httpx
from PIL import Image, UnidentifiedImageError

from serve_app.outbound import AddressGuard, FetchLimits, OutboundError, safe_get
from serve_app.protocol.errors import InvalidRequestError

__all__ = [
    "ImageFetcher",
    "ImagePolicy",
    "check_image_bytes",
    "decode_data_uri",
    "sniff_format",
    "validate_image_bytes",
]

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
    """Limits for image handling.

    ``allow_private_hosts`` turns the address guard off and ``address_allowed``
    replaces it: both for tests only (a local image server); loopback alone can
    also be allowed by ``GATEWAY_OUTBOUND_ALLOW_LOOPBACK_FOR_TESTS``.
    """

    max_bytes: int = MAX_IMAGE_BYTES
    max_fetched_urls: int = MAX_FETCHED_URLS
    fetch_timeout_s: float = 10.0
    allow_private_hosts: bool = False
    address_allowed: Callable[[str], bool] | None = None


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
    """Fetches remote images for one request, counting URLs against the cap.

    The fetch itself is the gateway's one outbound guard (``serve_app.outbound``):
    every resolved address public (embedded IPv4 unwrapped), the connection
    pinned to the vetted address, every redirect re-checked, proxy variables
    ignored. ``client`` is for tests and must neither follow redirects nor trust
    the environment.
    """

    def __init__(self, policy: ImagePolicy, client: httpx.AsyncClient | None = None) -> None:
        self.policy = policy
        self._client = client
        self.fetched = 0
        self._guard = AddressGuard(
            allow_private=policy.allow_private_hosts, allowed=policy.address_allowed
        )
        self._limits = FetchLimits(
            timeout_s=policy.fetch_timeout_s,
            max_bytes=policy.max_bytes,
            max_redirects=_MAX_REDIRECTS,
            oversize="refuse",
            accept="image/*",
        )

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
            fetched = await safe_get(url, self._limits, self._guard, client=self._client)
        except OutboundError as err:
            raise _invalid(param, self._reason(err)) from None
        if fetched.status != 200:
            raise _invalid(param, "the image URL answered with an error")
        return fetched.body

    def _reason(self, err: OutboundError) -> str:
        reasons = {
            "bad_url": "the image URL is malformed",
            "scheme": "image URLs must be http(s) with a host",
            "unresolvable": "the image host does not resolve",
            "refused": "image URLs may not point at private addresses",
            "too_large": f"the image is larger than {self.policy.max_bytes} bytes",
            "redirects": "too many redirects while fetching the image",
            "timeout": "fetching the image timed out",
        }
        failed = f"the image could not be fetched{str(err).removeprefix('failed')}"
        return reasons.get(err.kind, failed)


def _split(url: str, param: str) -> tuple[SplitResult, int | None]:
    """The URL's parts and explicit port; an unparseable URL (``http://[::1``, a port
    above 65535) is the caller's bad image, not a server error."""
    try:
        parts = urlsplit(url)
        return parts, parts.port
    except ValueError:
        raise _invalid(param, "the image URL is malformed") from None


def _invalid(param: str, reason: str) -> InvalidRequestError:
    return InvalidRequestError(f"Invalid image: {reason}.", code="invalid_image", param=param)
