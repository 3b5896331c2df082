"""An upload that its organization's storage quota cannot take is refused from its headers:
403 ``storage_quota_exceeded`` having read none of its body (``uploading_caller``, run by
``serve_app/ingress/auth_first.py``), when the organization is already at a bound or when
the declared ``Content-Length`` alone would pass it. The body bytes handed out are counted
through the ASGI ``receive``, as the 401 tests of ``tests/unit/ingress/test_auth_first.py`` do.
"""

from __future__ import annotations

import pytest

from tests.fixtures.gateway import HarnessFactory
from tests.unit.ingress.test_auth_first import UPLOAD, Answer, CountingBody, bearer, call
from tests.unit.storage.test_quota_routes import upload_file

MIB = 1024 * 1024
STORED_UPLOADS = ["/v1/files", "/api/adapters"]


def assert_refused_unread(answer: Answer, body: CountingBody) -> None:
    assert answer.status == 403, answer.body
    assert b'"storage_quota_exceeded"' in answer.body
    assert b'"permission_error"' in answer.body
    assert body.sent == 0 and body.calls == 0
    assert answer.headers["connection"] == "close"  # the server drops the unread bytes


@pytest.mark.parametrize("path", STORED_UPLOADS)
async def test_an_organization_at_its_object_bound_has_nothing_read(
    make_gateway: HarnessFactory, path: str
) -> None:
    gw = await make_gateway(args={"storage_quota": {"max_objects_per_org": 1}})
    async with gw.client(gw.keys["user"]) as http:
        assert (await upload_file(http, b"{}\n")).status_code == 200
    body = CountingBody(UPLOAD)
    answer = await call(gw, path, body, authorization=bearer(gw.keys["user"]))
    assert_refused_unread(answer, body)


@pytest.mark.parametrize("path", STORED_UPLOADS)
async def test_an_organization_at_its_byte_bound_has_nothing_read(
    make_gateway: HarnessFactory, path: str
) -> None:
    gw = await make_gateway(args={"storage_quota": {"max_bytes_per_org": 1000}})
    async with gw.client(gw.keys["user"]) as http:
        assert (await upload_file(http, b"x" * 1000)).status_code == 200  # exactly full
    body = CountingBody(4 * MIB)
    answer = await call(gw, path, body, authorization=bearer(gw.keys["user"]), declared=False)
    assert_refused_unread(answer, body)  # chunked: no size declared, and no room at all


async def test_a_declared_size_past_the_room_left_has_nothing_read(
    make_gateway: HarnessFactory,
) -> None:
    gw = await make_gateway(args={"storage_quota": {"max_bytes_per_org": 10 * MIB}})
    body = CountingBody(UPLOAD)  # 150 MiB declared into an empty organization of 10 MiB
    answer = await call(gw, "/v1/files", body, authorization=bearer(gw.keys["user"]))
    assert_refused_unread(answer, body)
    assert f"{UPLOAD - 64 * 1024}".encode() in answer.body  # the size it was judged by


async def test_an_upload_with_room_is_read(make_gateway: HarnessFactory) -> None:
    """The control: within the room (and another organization's full one changes nothing),
    the body is read and refused by the multipart parser instead."""
    gw = await make_gateway(args={"storage_quota": {"max_bytes_per_org": 10 * MIB}})
    other = gw.store.create_key("oz", "other-org")
    async with gw.client(other) as http:
        assert (await upload_file(http, b"x" * (10 * MIB))).status_code == 200
    body = CountingBody(4 * MIB)
    answer = await call(gw, "/v1/files", body, authorization=bearer(gw.keys["user"]))
    assert answer.status == 400, answer.body  # not multipart at all
    assert body.sent > 0
