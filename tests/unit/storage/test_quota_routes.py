"""``storage_quota`` through the app: ``/v1/files`` and ``/api/adapters`` uploads past an
organization's stored objects or bytes get 403 ``storage_quota_exceeded`` in the error
envelope; other organizations are unaffected; deleting makes room."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import httpx

from tests.fixtures.adapters import LORA_BASE, adapter_files, lora_catalog, operator_adapter_dir
from tests.fixtures.adapters import zipped as zip_files
from tests.fixtures.gateway import GatewayHarness, HarnessFactory


async def upload_file(http: httpx.AsyncClient, data: bytes) -> httpx.Response:
    return await http.post(
        "/v1/files",
        files={"file": ("in.jsonl", data, "application/jsonl")},
        data={"purpose": "batch"},
    )


async def upload_adapter(http: httpx.AsyncClient, name: str) -> httpx.Response:
    return await http.post(
        "/api/adapters",
        data={"name": name, "base_model": LORA_BASE},
        files={"file": ("a.zip", zip_files(adapter_files(rank=4)), "application/zip")},
    )


def assert_quota_refusal(answer: httpx.Response) -> None:
    assert answer.status_code == 403, answer.text
    assert answer.json() == {
        "error": {
            "message": answer.json()["error"]["message"],
            "type": "permission_error",
            "code": "storage_quota_exceeded",
            "param": "file",
        }
    }


def stored_files(harness: GatewayHarness) -> list[Path]:
    root = harness.app.state.gateway.files.objects
    folder = Path(getattr(root, "root", "")) / "files"
    return sorted(folder.iterdir()) if folder.is_dir() else []


async def test_the_file_count_bound(make_gateway: HarnessFactory) -> None:
    gw = await make_gateway(args={"storage_quota": {"max_objects_per_org": 2}})
    other = gw.store.create_key("oz", "other-org")
    async with gw.client(gw.keys["user"]) as http:
        ids = [(await upload_file(http, b"{}\n")).json()["id"] for _ in range(2)]
        assert_quota_refusal(await upload_file(http, b"{}\n"))
        assert len((await http.get("/v1/files")).json()["data"]) == 2
        async with gw.client(other) as theirs:  # another organization has its own room
            assert (await upload_file(theirs, b"{}\n")).status_code == 200
        assert (await http.delete(f"/v1/files/{ids[0]}")).status_code == 200
        assert (await upload_file(http, b"{}\n")).status_code == 200  # deleting made room


async def test_the_byte_bound_and_nothing_stored_for_a_refusal(
    make_gateway: HarnessFactory,
) -> None:
    gw = await make_gateway(args={"storage_quota": {"max_bytes_per_org": 1000}})
    async with gw.client(gw.keys["user"]) as http:
        assert (await upload_file(http, b"x" * 600)).status_code == 200
        before = stored_files(gw)
        assert len(before) == 1
        refusal = await upload_file(http, b"x" * 401)
        assert_quota_refusal(refusal)
        assert "1001" in refusal.json()["error"]["message"]
        assert stored_files(gw) == before  # the refused upload's bytes are not kept
        assert (await upload_file(http, b"x" * 400)).status_code == 200


async def test_adapters_and_files_share_the_organization_s_bound(
    make_gateway: HarnessFactory, tmp_path: Path
) -> None:
    args: dict[str, Any] = {
        "catalog": lora_catalog(operator_adapter_dir(tmp_path)),
        "storage_quota": {"max_objects_per_org": 2},
    }
    gw = await make_gateway(args=args)
    admin = gw.store.create_key("ann", "acme", role="admin")
    async with gw.client(admin) as http:
        assert (await upload_file(http, b"{}\n")).status_code == 200
        assert (await upload_adapter(http, "one")).status_code == 200
        assert_quota_refusal(await upload_adapter(http, "two"))
        assert_quota_refusal(await upload_file(http, b"{}\n"))
        names = [a["name"] for a in (await http.get("/api/adapters")).json()["data"]]
        assert "two" not in names
        assert (await http.delete("/api/adapters/one")).status_code == 200
        assert (await upload_adapter(http, "two")).status_code == 200
