"""HTTP GET of model-chosen URLs under hostile-input rules (``web_fetch``).

A URL written by a model is attacker-controlled input. The guard and the
pinned, redirect-checked fetch are the gateway's one outbound module
(``serve_app.outbound``), shared with image URLs in chat; this module only
words the outcome for the model and keeps ``web_fetch``'s limits (a page is
truncated at the byte cap rather than refused).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from serve_app.outbound import AddressGuard, FetchLimits, OutboundError, safe_get

_USER_AGENT = "inference-gateway-web-fetch/1.0"
_ACCEPT = "text/html,text/plain,application/json;q=0.9,*/*;q=0.5"


class FetchError(Exception):
    """The fetch did not produce a page; the message is safe to show the model."""


@dataclass
class FetchedPage:
    url: str
    status: int
    content_type: str
    body: bytes


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
        self.guard = AddressGuard(allow_private=allow_private_hosts, allowed=address_allowed)
        self._limits = FetchLimits(
            timeout_s=timeout_s,
            max_bytes=max_bytes,
            max_redirects=max_redirects,
            oversize="truncate",
            accept=_ACCEPT,
            user_agent=_USER_AGENT,
        )

    async def get(self, url: str) -> FetchedPage:
        try:
            fetched = await safe_get(url, self._limits, self.guard)
        except OutboundError as err:
            if err.kind in ("timeout", "failed"):
                raise FetchError(f"fetching {url} {err}") from None
            raise FetchError(str(err)) from None
        return FetchedPage(fetched.url, fetched.status, fetched.content_type, fetched.body)
