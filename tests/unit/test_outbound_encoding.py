"""Outbound fetches ask for ``identity`` and cap the body before decompression
(serve_app/outbound/fetch.py; docs/api.md#tenant-isolation).

A real loopback server (``tests.fixtures.tool_servers.LocalWeb``) sends compressed
bodies whatever it was asked for, as a hostile site would: a 200 KB gzip of 200 MB of
zeros must neither inflate in memory nor get past the cap, for both callers of the
fetch (image URLs refuse an oversize body, web_fetch keeps its first bytes). Memory is
what ``tracemalloc`` sees during the fetch: about 6 MB with the cap of 1 MB (the HTTP
client's TLS context included), about 150 MB when the client inflated the chunks itself.
"""

from __future__ import annotations

import tracemalloc
from collections.abc import Iterator
from typing import Literal

import pytest

from serve_app.inference.images import ImageFetcher, ImagePolicy
from serve_app.outbound import AddressGuard, FetchLimits, OutboundError, safe_get
from serve_app.protocol.errors import InvalidRequestError
from serve_app.tools.safe_fetch import SafeFetcher
from tests.fixtures.tool_servers import ENCODED_TEXT, LocalWeb, encoded_body

CAP = 1_000_000
BOMB = 200_000_000
GUARD = AddressGuard(allow_private=True)


@pytest.fixture(scope="module")
def web() -> Iterator[LocalWeb]:
    server = LocalWeb()
    yield server
    server.close()


@pytest.fixture(scope="module")
def bomb(web: LocalWeb) -> str:
    """The bomb's URL; built here first (the server keeps it), outside any measure."""
    assert len(encoded_body("gzip", BOMB)) < CAP
    return f"{web.base_url}/encoded?coding=gzip&size={BOMB}"


def _limits(oversize: Literal["truncate", "refuse"]) -> FetchLimits:
    return FetchLimits(timeout_s=30, max_bytes=CAP, max_redirects=0, oversize=oversize)


def _plain(size: int) -> bytes:
    return (ENCODED_TEXT + bytes(size))[:size]


async def test_the_body_is_asked_for_uncompressed(web: LocalWeb) -> None:
    await safe_get(f"{web.base_url}/page/1", _limits("refuse"), GUARD)
    headers = {k.lower(): v for k, v in web.requests[-1][2].items()}
    assert headers["accept-encoding"] == "identity"


@pytest.mark.parametrize("coding", ["gzip", "x-gzip", "deflate", "raw-deflate"])
async def test_a_compressed_body_sent_anyway_is_decoded(web: LocalWeb, coding: str) -> None:
    url = f"{web.base_url}/encoded?coding={coding}&size=5000"
    fetched = await safe_get(url, _limits("refuse"), GUARD)
    assert fetched.body == _plain(5000)


@pytest.mark.parametrize("length", ["1", "0"])
async def test_a_gzip_bomb_is_refused_without_inflating(bomb: str, length: str) -> None:
    tracemalloc.start()
    try:
        with pytest.raises(OutboundError) as refused:
            await safe_get(f"{bomb}&length={length}", _limits("refuse"), GUARD)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert refused.value.kind == "too_large"
    assert peak < 16 * CAP, f"{peak} bytes held while refusing a gzip bomb"


async def test_a_gzip_bomb_is_cut_at_the_cap_when_truncating(bomb: str) -> None:
    tracemalloc.start()
    try:
        fetched = await safe_get(f"{bomb}&length=0", _limits("truncate"), GUARD)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert fetched.body == _plain(CAP)
    assert peak < 16 * CAP, f"{peak} bytes held while cutting a gzip bomb"


@pytest.mark.parametrize("coding", ["br", "zstd", "gzip, gzip", "compress"])
async def test_other_encodings_fail_the_fetch(web: LocalWeb, coding: str) -> None:
    url = f"{web.base_url}/encoded?coding={coding}&size=100"
    with pytest.raises(OutboundError) as failed:
        await safe_get(url, _limits("refuse"), GUARD)
    assert failed.value.kind == "failed"


@pytest.mark.parametrize("coding", ["fake-gzip", "fake-deflate"])
async def test_a_body_that_does_not_decompress_fails_the_fetch(web: LocalWeb, coding: str) -> None:
    url = f"{web.base_url}/encoded?coding={coding}&size=100"  # labelled compressed, sent plain
    with pytest.raises(OutboundError) as failed:
        await safe_get(url, _limits("refuse"), GUARD)
    assert failed.value.kind == "failed"


async def test_both_callers_hold_the_cap_on_a_bomb(bomb: str) -> None:
    url = bomb
    page = await SafeFetcher(
        timeout_s=30, max_bytes=CAP, max_redirects=0, allow_private_hosts=True
    ).get(url)
    assert page.body == _plain(CAP)
    images = ImageFetcher(ImagePolicy(max_bytes=CAP, address_allowed=lambda _: True))
    with pytest.raises(InvalidRequestError) as refused:
        await images.resolve(url, "messages[0].content[0]")
    assert f"larger than {CAP} bytes" in str(refused.value)
