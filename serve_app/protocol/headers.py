"""Response headers of the contract (docs/reference/common.md#response-headers) and how their
values are made safe.

``x-service-ignored-params`` names request fields, and field names are the
client's own text: a name with CR/LF would split the response's headers, and
one outside Latin-1 cannot be encoded in a header at all (a 500). Names are
therefore percent-encoded (RFC 3986 unreserved characters and ``[]`` stay as
they are, so ``logit_bias`` or ``tools[0]`` read unchanged) and the list is
capped, so a body of a thousand junk fields cannot produce a header that
proxies refuse.
"""

from __future__ import annotations

from collections.abc import Iterable
from urllib.parse import quote

IGNORED_PARAMS_HEADER = "x-service-ignored-params"
RESIDENCY_HEADER = "X-Service-Residency"

MAX_IGNORED_HEADER_CHARS = 1024
_NAME_CHARS = 64


def ignored_params_value(names: Iterable[str]) -> str:
    """The header value: sorted, unique, encoded names, comma-separated, at most 1 KiB."""
    shown: list[str] = []
    size = 0
    for name in sorted({n for n in names if n}):
        encoded = quote(name[:_NAME_CHARS], safe="[]")
        extra = len(encoded) + (2 if shown else 0)
        if size + extra > MAX_IGNORED_HEADER_CHARS - 5:  # leaves room for ", ..."
            shown.append("...")
            break
        shown.append(encoded)
        size += extra
    return ", ".join(shown)


def ignored_params_header(names: Iterable[str]) -> dict[str, str]:
    """``{x-service-ignored-params: ...}``, or nothing when no parameter was dropped."""
    value = ignored_params_value(names)
    return {IGNORED_PARAMS_HEADER: value} if value else {}
