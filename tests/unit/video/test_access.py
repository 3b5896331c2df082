"""Jobs belong to their user: the uniform 404, the list, and the cap through the API."""

from __future__ import annotations

import asyncio

import prometheus_client
import pytest

from serve_app.metrics import GatewayMetrics, PrometheusBackend
from serve_app.protocol.errors import video_job_not_found
from tests.unit.video.conftest import VIDEO, VideoRig

MISSING = "vgen_0123456789abcdef01234567"


async def test_someone_elses_job_is_exactly_a_missing_job(rig: VideoRig) -> None:
    job_id = (await rig.create("user")).json()["id"]
    async with rig.client("external") as http:  # another user, another org
        foreign = [
            await http.get(f"/v1/video/generations/{job_id}"),
            await http.post(f"/v1/video/generations/{job_id}/cancel"),
        ]
        missing = [
            await http.get(f"/v1/video/generations/{MISSING}"),
            await http.post(f"/v1/video/generations/{MISSING}/cancel"),
        ]
        listed = (await http.get("/v1/video/generations")).json()
    for response, job in [*((r, job_id) for r in foreign), *((r, MISSING) for r in missing)]:
        assert response.status_code == 404
        assert response.json() == video_job_not_found(job).envelope()
    assert {k: v for k, v in foreign[0].json()["error"].items() if k != "message"} == {
        k: v for k, v in missing[0].json()["error"].items() if k != "message"
    }
    assert listed == {"object": "list", "data": []}
    assert (await rig.job(job_id))["status"] == "queued"  # the foreign cancel changed nothing


async def test_the_same_user_in_another_organization_sees_none_of_its_jobs(
    rig: VideoRig,
) -> None:
    job_id = (await rig.create("user")).json()["id"]  # alice, in acme
    rig.harness.keys["alice_elsewhere"] = rig.harness.store.create_key("alice", "other-org")
    async with rig.client("alice_elsewhere") as http:
        got = await http.get(f"/v1/video/generations/{job_id}")
        cancelled = await http.post(f"/v1/video/generations/{job_id}/cancel")
        listed = (await http.get("/v1/video/generations")).json()
    for response in (got, cancelled):
        assert response.status_code == 404
        assert response.json() == video_job_not_found(job_id).envelope()
    assert listed == {"object": "list", "data": []}
    assert (await rig.job(job_id))["status"] == "queued"  # acme's key still sees it, uncancelled


@pytest.mark.parametrize(
    "job_id",
    [
        "vgen_nope",
        "VGEN_0123456789ABCDEF01234567",
        "..%2F..%2Fetc%2Fpasswd",
        "x" * 5000,
        "vgen_0123456789abcdef01234567' OR '1'='1",
        "%00",
    ],
)
async def test_malformed_job_ids_are_404s(rig: VideoRig, job_id: str) -> None:
    async with rig.client() as http:
        got = await http.get(f"/v1/video/generations/{job_id}")
        cancelled = await http.post(f"/v1/video/generations/{job_id}/cancel")
    for response in (got, cancelled):
        assert response.status_code == 404, response.text
        assert response.json()["error"]["type"] == "invalid_request_error"


async def test_the_list_is_the_callers_twenty_newest_first(rig: VideoRig) -> None:
    ids = []
    async with rig.client() as http:
        for _ in range(22):
            job_id = (await rig.create()).json()["id"]
            await http.post(f"/v1/video/generations/{job_id}/cancel")
            ids.append(job_id)
        await rig.create("external")
        listing = (await http.get("/v1/video/generations")).json()
    assert listing["object"] == "list"
    assert [j["id"] for j in listing["data"]] == ids[::-1][:20]
    assert all(j["object"] == "video.generation" for j in listing["data"])


async def test_the_third_unfinished_job_is_refused(rig: VideoRig) -> None:
    first = await rig.create()
    second = await rig.create()
    third = await rig.create()
    assert (first.status_code, second.status_code, third.status_code) == (202, 202, 429)
    error = third.json()["error"]
    assert (error["type"], error["code"]) == ("rate_limit_error", "video_jobs_quota_exceeded")
    assert int(third.headers["retry-after"]) >= 1
    assert (await rig.create("external")).status_code == 202  # another user's own cap
    async with rig.client() as http:
        await http.post(f"/v1/video/generations/{first.json()['id']}/cancel")
    assert (await rig.create()).status_code == 202


async def test_concurrent_creates_get_exactly_two_jobs(rig: VideoRig) -> None:
    responses = await asyncio.gather(*(rig.create() for _ in range(8)))
    statuses = sorted(r.status_code for r in responses)
    assert statuses == [202, 202] + [429] * 6
    async with rig.client() as http:
        assert len((await http.get("/v1/video/generations")).json()["data"]) == 2


async def test_rate_limits_apply_to_creates(rig: VideoRig) -> None:
    rig.harness.store.update_user("alice", rpm=1)  # the "user" key's user
    assert (await rig.create()).status_code == 202
    limited = await rig.create()
    assert (limited.status_code, limited.json()["error"]["code"]) == (429, "rate_limit_exceeded")
    async with rig.client() as http:  # the refused create queued nothing
        assert len((await http.get("/v1/video/generations")).json()["data"]) == 1


async def test_job_quota_refusals_are_counted_as_rate_limited(rig: VideoRig) -> None:
    registry = prometheus_client.CollectorRegistry()
    rig.harness.app.state.gateway.video.usage.metering.metrics = GatewayMetrics(
        PrometheusBackend(registry)
    )
    statuses = [(await rig.create()).status_code for _ in range(3)]
    assert statuses == [202, 202, 429]

    def value(name: str, **labels: str) -> float | None:
        return registry.get_sample_value(name, {"model": VIDEO, **labels})

    endpoint = {"endpoint": "video"}
    assert value("gateway_requests_total", **endpoint, outcome="ok") == 2
    assert value("gateway_requests_total", **endpoint, outcome="rejected") == 1
    assert value("gateway_rate_limited_total", code="video_jobs_quota_exceeded") == 1
