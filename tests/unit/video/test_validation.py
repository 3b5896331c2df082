"""The bounds of ``POST /v1/video/generations`` and its refusals, through the app
(docs/reference/video.md#create-a-job)."""

from __future__ import annotations

from typing import Any

import pytest

from deployments.video.base import (
    VideoDefaults,
    VideoEngineInfo,
    VideoLimits,
    resolve_params,
)
from serve_app.contract.video import VideoRequest, round_num_frames
from tests.unit.video.conftest import UNSERVED, VIDEO, VideoRig

BASE = {"model": VIDEO, "prompt": "a cat"}


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("width", 705),
        ("width", 0),
        ("width", -64),
        ("height", 481),
        ("fps", 7),
        ("fps", 31),
        ("num_frames", 162),
        ("num_frames", 0),
        ("num_inference_steps", 51),
        ("num_inference_steps", 0),
        ("seed", -1),
        ("seed", 2**63),
        ("width", "64"),
        ("width", 64.5),
        ("width", 1e300),
        ("fps", True),
        ("prompt", "x" * 2001),
        ("prompt", "   "),
        ("prompt", ""),
        ("prompt", ["a", "cat"]),
        ("prompt", "a cat\x00"),
        ("negative_prompt", "x" * 2001),
        ("negative_prompt", "\x00"),
        ("negative_prompt", 5),
        ("model", 7),
    ],
)
async def test_out_of_range_or_wrong_type_is_a_400_naming_the_field(
    rig: VideoRig, field: str, value: Any
) -> None:
    async with rig.client() as http:
        response = await http.post("/v1/video/generations", json={**BASE, field: value})
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert (error["type"], error["code"], error["param"]) == (
        "invalid_request_error",
        "invalid_value",
        field,
    )
    async with rig.client() as http:  # nothing was queued
        assert (await http.get("/v1/video/generations")).json()["data"] == []


@pytest.mark.parametrize("missing", ["model", "prompt"])
async def test_missing_required_field(rig: VideoRig, missing: str) -> None:
    body = {k: v for k, v in BASE.items() if k != missing}
    async with rig.client() as http:
        response = await http.post("/v1/video/generations", json=body)
    error = response.json()["error"]
    assert (response.status_code, error["code"], error["param"]) == (
        400,
        "missing_required_parameter",
        missing,
    )


async def test_the_spec_maxima_and_minima_are_accepted(rig: VideoRig) -> None:
    top = {"width": 704, "height": 480, "fps": 30, "num_frames": 161, "num_inference_steps": 50}
    first = await rig.create(prompt="x" * 2000, negative_prompt="y" * 2000, seed=2**63 - 1, **top)
    second = await rig.create(fps=8, width=1, height=1, num_frames=1, num_inference_steps=1)
    for response in (first, second):
        assert response.status_code == 202, response.text
        job = response.json()
        assert job["id"].startswith("vgen_") and job["status"] == "queued"
        assert job["object"] == "video.generation" and job["model"] == VIDEO
        assert isinstance(job["created"], int)
        assert "video" not in job and "error" not in job


async def test_null_fields_mean_the_model_defaults(rig: VideoRig) -> None:
    response = await rig.create(width=None, fps=None, seed=None, negative_prompt=None)
    assert response.status_code == 202, response.text
    assert await rig.core.run_once()
    (params,) = rig.engine.seen
    assert (params.width, params.fps, params.num_frames) == (32, 8, 9)  # scripted defaults


async def test_unknown_fields_are_ignored_and_named(rig: VideoRig) -> None:
    response = await rig.create(size="1280x720", quality="hd")
    assert response.status_code == 202
    assert response.headers["x-service-ignored-params"] == "quality, size"


@pytest.mark.parametrize(
    ("model", "status", "code"),
    [
        ("no-such-model", 404, "model_not_found"),
        ("scripted-chat", 400, "model_not_supported_for_endpoint"),
        ("tts-model", 400, "model_not_supported_for_endpoint"),
        (UNSERVED, 503, "model_unavailable"),
    ],
)
async def test_models_that_cannot_make_videos(
    rig: VideoRig, model: str, status: int, code: str
) -> None:
    response = await rig.create(model=model)
    assert (response.status_code, response.json()["error"]["code"]) == (status, code)


async def test_a_chat_model_names_the_video_route(rig: VideoRig) -> None:
    async with rig.client() as http:
        response = await http.post(
            "/v1/chat/completions",
            json={"model": VIDEO, "messages": [{"role": "user", "content": "hi"}]},
        )
    assert response.status_code == 400
    assert "/v1/video/generations" in response.json()["error"]["message"]


@pytest.mark.parametrize("body", [b"{not json", b"[1, 2]", b'"a string"'])
async def test_a_body_that_is_not_a_json_object(rig: VideoRig, body: bytes) -> None:
    async with rig.client() as http:
        response = await http.post(
            "/v1/video/generations", content=body, headers={"content-type": "application/json"}
        )
    assert (response.status_code, response.json()["error"]["code"]) == (400, "invalid_json")


@pytest.mark.parametrize(
    ("method", "path"),
    [
        ("POST", "/v1/video/generations"),
        ("GET", "/v1/video/generations"),
        ("GET", "/v1/video/generations/vgen_0123456789abcdef01234567"),
        ("POST", "/v1/video/generations/vgen_0123456789abcdef01234567/cancel"),
    ],
)
@pytest.mark.parametrize("key", [None, "revoked", "no_scope"])
async def test_every_job_route_needs_an_inference_key(
    rig: VideoRig, method: str, path: str, key: str | None
) -> None:
    token = rig.harness.keys[key] if key else None
    async with rig.harness.client(token) as http:
        response = await http.request(method, path, json=BASE if method == "POST" else None)
    expected = 403 if key == "no_scope" else 401
    assert response.status_code == expected, response.text


@pytest.mark.parametrize(
    ("requested", "rounded"),
    [(1, 1), (4, 1), (5, 9), (9, 9), (12, 9), (13, 17), (100, 97), (156, 153), (157, 161)],
)
def test_num_frames_rounds_to_the_nearest_8k_plus_1(requested: int, rounded: int) -> None:
    assert round_num_frames(requested) == rounded
    assert all(round_num_frames(n) <= 161 for n in range(1, 162))


async def test_the_rounded_frame_count_reaches_the_engine(rig: VideoRig) -> None:
    assert (await rig.create(num_frames=12)).status_code == 202
    assert await rig.core.run_once()
    assert rig.engine.seen[0].num_frames == 9


INFO = VideoEngineInfo(
    defaults=VideoDefaults(width=64, height=64, num_frames=17, fps=8, num_inference_steps=4),
    limits=VideoLimits(max_width=256, max_height=256, max_num_frames=33, max_inference_steps=8),
    size_multiple=16,
)


def test_requests_beyond_a_backends_limits_are_scaled_down_keeping_the_aspect() -> None:
    request = VideoRequest(
        prompt="p",
        negative_prompt=None,
        seed=1,
        width=704,
        height=480,
        num_frames=161,
        fps=30,
        num_inference_steps=50,
    )
    params = resolve_params(request, INFO)
    assert (params.width, params.height) == (256, 160)  # 704x480 x 256/704 -> 256x174 -> 160
    assert (params.num_frames, params.num_inference_steps, params.fps) == (33, 8, 30)
    assert params.seconds == 1.1


def test_omitted_fields_take_the_defaults_and_sizes_snap_to_blocks() -> None:
    params = resolve_params(VideoRequest(prompt="p", negative_prompt=None, seed=0, width=40), INFO)
    assert (params.width, params.height, params.num_frames, params.fps) == (32, 64, 17, 8)
    tiny = resolve_params(VideoRequest(prompt="p", negative_prompt=None, seed=0, width=1), INFO)
    assert tiny.width == 16  # at least one block
