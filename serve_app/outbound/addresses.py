"""Which addresses an outbound fetch may connect to.

A URL from a client or a model may name the gateway's own services or the
cloud metadata endpoint in forms a string check misses: ``127.1``,
``2130706433``, ``0x7f000001``, ``[::ffff:127.0.0.1]``, ``[::1]``, ``0.0.0.0``,
a public DNS name that resolves to loopback, IPv4 carried inside an IPv6
address (IPv4-mapped, IPv4-compatible, 6to4, NAT64, Teredo). The guard
therefore looks at resolved addresses only, unwraps every embedded IPv4 and
requires *both* the outer and the embedded address to be public unicast.

Tests need to fetch from a server on loopback. ``allow_private`` (the
``allow_private_hosts`` config flags) turns the guard off entirely; the
narrower ``GATEWAY_OUTBOUND_ALLOW_LOOPBACK_FOR_TESTS=1`` admits loopback
addresses only (127.0.0.0/8, ::1 and their IPv6 wrappings), never private,
link-local or metadata ranges. Both are for tests: production configs must not
set them (the production config check should refuse them).
"""

from __future__ import annotations

import ipaddress
import logging
import os
from collections.abc import Callable
from dataclasses import dataclass

logger = logging.getLogger(__name__)

LOOPBACK_FOR_TESTS_ENV = "GATEWAY_OUTBOUND_ALLOW_LOOPBACK_FOR_TESTS"

_NAT64 = (ipaddress.ip_network("64:ff9b::/96"), ipaddress.ip_network("64:ff9b:1::/48"))

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address


def _parse(address: str) -> IPAddress | None:
    try:
        return ipaddress.ip_address(address.split("%", 1)[0])
    except ValueError:
        return None


def embedded_ipv4(ip: ipaddress.IPv6Address) -> ipaddress.IPv4Address | bool | None:
    """The IPv4 address an IPv6 form carries; False for the deprecated ``::a.b.c.d``
    (IPv4-compatible, never a real target); None when it carries none."""
    if ip.ipv4_mapped is not None:
        return ip.ipv4_mapped
    if ip.sixtofour is not None:
        return ip.sixtofour
    if ip.teredo is not None:
        return ip.teredo[1]
    if any(ip in net for net in _NAT64):
        return ipaddress.IPv4Address(int(ip) & 0xFFFFFFFF)
    if int(ip) >> 32 == 0:
        return False
    return None


def _is_global_unicast(ip: IPAddress) -> bool:
    return ip.is_global and not (ip.is_multicast or ip.is_reserved or ip.is_loopback)


def is_public_address(address: str) -> bool:
    """True only for global unicast addresses that embed no non-public IPv4."""
    ip = _parse(address)
    if ip is None:
        return False
    if isinstance(ip, ipaddress.IPv6Address):
        inner = embedded_ipv4(ip)
        if inner is False:
            return False
        if isinstance(inner, ipaddress.IPv4Address):
            if not _is_global_unicast(inner):
                return False
            if ip.ipv4_mapped is not None:
                return True  # ::ffff:a.b.c.d is a.b.c.d itself
    return _is_global_unicast(ip)


def is_loopback_target(address: str) -> bool:
    """127.0.0.0/8 or ::1, also when wrapped in an IPv6 form (``::ffff:127.0.0.1``)."""
    ip = _parse(address)
    if ip is None:
        return False
    if isinstance(ip, ipaddress.IPv6Address):
        inner = embedded_ipv4(ip)
        if isinstance(inner, ipaddress.IPv4Address):
            return inner.is_loopback
    return ip.is_loopback


def loopback_for_tests_enabled() -> bool:
    """``GATEWAY_OUTBOUND_ALLOW_LOOPBACK_FOR_TESTS`` is set to 1/true (default off)."""
    return os.environ.get(LOOPBACK_FOR_TESTS_ENV, "").strip().lower() in ("1", "true", "yes")


@dataclass(frozen=True)
class AddressGuard:
    """The rule every resolved address of every hop must pass.

    ``allowed`` replaces the rule outright (tests that play a "public" site on
    127.0.0.2); ``allow_private`` admits everything (the config's
    ``allow_private_hosts``, tests only); ``allow_loopback`` admits loopback on
    top of public addresses (None: read the test environment variable).
    """

    allow_private: bool = False
    allow_loopback: bool | None = None
    allowed: Callable[[str], bool] | None = None

    def permits(self, address: str) -> bool:
        if self.allowed is not None:
            return self.allowed(address)
        if self.allow_private:
            return True
        if is_public_address(address):
            return True
        loopback = self.allow_loopback
        if loopback is None:
            loopback = loopback_for_tests_enabled()
        if loopback and is_loopback_target(address):
            logger.warning(
                "outbound fetch to loopback %s allowed by %s", address, LOOPBACK_FOR_TESTS_ENV
            )
            return True
        return False
