"""Outbound HTTP the gateway makes on a client's behalf, under one SSRF guard.

Image URLs in chat and responses (``serve_app.inference.images``) and the
``web_fetch`` server tool (``serve_app.tools.safe_fetch``) both fetch URLs an
outsider wrote. They share this package: ``addresses`` decides which resolved
addresses may be connected to, ``fetch`` does the pinned, redirect-checked GET.
External providers are not here: their URLs are configured by the operator.
"""

from serve_app.outbound.addresses import (
    LOOPBACK_FOR_TESTS_ENV,
    AddressGuard,
    embedded_ipv4,
    is_loopback_target,
    is_public_address,
    loopback_for_tests_enabled,
)
from serve_app.outbound.fetch import FetchLimits, OutboundError, OutboundResponse, safe_get

__all__ = [
    "LOOPBACK_FOR_TESTS_ENV",
    "AddressGuard",
    "FetchLimits",
    "OutboundError",
    "OutboundResponse",
    "embedded_ipv4",
    "is_loopback_target",
    "is_public_address",
    "loopback_for_tests_enabled",
    "safe_get",
]
