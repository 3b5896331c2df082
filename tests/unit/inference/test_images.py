"""Images in chat messages: bytes sniffing, safe fetching, limits (docs/reference/chat.md#messages,
docs/reference/common.md#limits)."""

from __future__ import annotations

import base64
import io
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, ClassVar

import pytest
from PIL import Image

from serve_app.inference.images import (
    ImageFetcher,
    ImagePolicy,
    sniff_format,
    validate_image_bytes,
)
from serve_app.outbound import is_public_address
from serve_app.protocol.errors import InvalidRequestError
from tests.fixtures.gateway import GatewayHarness


def _image(fmt: str) -> bytes:
    buf = io.BytesIO()
    Image.new("RGB", (4, 4), (200, 10, 10)).save(buf, format=fmt)
    return buf.getvalue()


@pytest.mark.parametrize("fmt", ["PNG", "JPEG", "GIF", "WEBP", "BMP", "TIFF"])
def test_every_format_identified_by_bytes(fmt: str) -> None:
    data = _image(fmt)
    assert sniff_format(data) == fmt.lower()
    uri = validate_image_bytes(data, "p", ImagePolicy())
    assert uri.startswith(f"data:image/{fmt.lower()};base64,")


def test_declared_type_is_ignored_and_garbage_refused() -> None:
    png = _image("PNG")
    fetcher = ImageFetcher(ImagePolicy())
    import asyncio

    lying = "data:image/jpeg;base64," + base64.b64encode(png).decode()
    assert asyncio.run(fetcher.resolve(lying, "p")).startswith("data:image/png")
    for bad in (b"not an image", png[:20]):
        with pytest.raises(InvalidRequestError) as err:
            validate_image_bytes(bad, "messages[0].content[1].image_url", ImagePolicy())
        assert err.value.code == "invalid_image"
        assert err.value.param == "messages[0].content[1].image_url"


def test_private_addresses_are_not_public() -> None:
    for addr in ("127.0.0.1", "10.0.0.1", "192.168.1.1", "169.254.169.254", "::1", "0.0.0.0"):
        assert not is_public_address(addr)
    assert not is_public_address("::ffff:127.0.0.1")
    assert is_public_address("8.8.8.8")


class _ImageHandler(BaseHTTPRequestHandler):
    routes: ClassVar[dict[str, tuple[int, dict[str, str], bytes]]] = {}

    def do_GET(self) -> None:
        status, headers, body = self.routes.get(self.path, (404, {}, b""))
        self.send_response(status)
        for k, v in headers.items():
            self.send_header(k, v)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: Any) -> None:
        return


@pytest.fixture
def image_server() -> Iterator[str]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), _ImageHandler)
    _ImageHandler.routes = {
        "/ok.png": (200, {"Content-Type": "image/jpeg"}, _image("PNG")),
        "/big": (200, {}, b"\x89PNG\r\n\x1a\n" + b"0" * 5000),
        "/redirect": (302, {"Location": "/ok.png"}, b""),
    }
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()


async def test_fetch_blocks_loopback_by_default(image_server: str) -> None:
    fetcher = ImageFetcher(ImagePolicy())
    with pytest.raises(InvalidRequestError) as err:
        await fetcher.resolve(f"{image_server}/ok.png", "p")
    assert "private" in err.value.message


async def test_fetch_follows_redirect_and_caps_size(image_server: str) -> None:
    policy = ImagePolicy(allow_private_hosts=True, max_bytes=4000)
    uri = await ImageFetcher(policy).resolve(f"{image_server}/redirect", "p")
    assert uri.startswith("data:image/png;base64,")
    with pytest.raises(InvalidRequestError) as err:
        await ImageFetcher(policy).resolve(f"{image_server}/big", "p")
    assert "larger" in err.value.message


async def test_fetch_count_cap(image_server: str) -> None:
    fetcher = ImageFetcher(ImagePolicy(allow_private_hosts=True, max_fetched_urls=1))
    await fetcher.resolve(f"{image_server}/ok.png", "a")
    with pytest.raises(InvalidRequestError) as err:
        await fetcher.resolve(f"{image_server}/ok.png", "b")
    assert err.value.param == "b"


async def test_chat_image_parts(gateway: GatewayHarness) -> None:
    png = "data:image/png;base64," + base64.b64encode(_image("PNG")).decode()
    content = [{"type": "text", "text": "what"}, {"type": "image_url", "image_url": {"url": png}}]
    bad = [{"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}}]
    async with gateway.client(gateway.keys["user"]) as http:
        ok = await http.post(
            "/v1/chat/completions",
            json={"model": "scripted-vision", "messages": [{"role": "user", "content": content}]},
        )
        broken = await http.post(
            "/v1/chat/completions",
            json={"model": "scripted-vision", "messages": [{"role": "user", "content": bad}]},
        )
        text_only = await http.post(
            "/v1/chat/completions",
            json={"model": "scripted-chat", "messages": [{"role": "user", "content": content}]},
        )
        private = await http.post(
            "/v1/chat/completions",
            json={
                "model": "scripted-vision",
                "messages": [
                    {
                        "role": "user",
                        "content": [
                            {"type": "image_url", "image_url": {"url": "http://127.0.0.1/x.png"}}
                        ],
                    }
                ],
            },
        )
    assert ok.status_code == 200
    assert broken.status_code == 400
    assert broken.json()["error"]["code"] == "invalid_image"
    assert broken.json()["error"]["param"] == "messages[0].content[0].image_url"
    assert text_only.status_code == 400
    assert private.status_code == 400 and private.json()["error"]["code"] == "invalid_image"
