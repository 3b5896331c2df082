"""The real CPU backend (diffusers WanPipeline on the tiny local model), the MP4 encoder,
and the video engine configs of the shipped catalogs."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import yaml

from deployments import registry
from deployments.local_models.tiny_video_model import ensure_tiny_wan
from deployments.video.base import GenerationCancelled, VideoEngine, resolve_params
from deployments.video.diffusers_engine import DiffusersVideoConfig, LtxVideoConfig
from deployments.video.mp4 import encode_mp4
from serve_app.catalog.config import CatalogModel
from serve_app.config import REPO_ROOT
from serve_app.contract.video import VideoRequest
from tests.unit.video.conftest import Mp4Facts, RigFactory, mp4_facts


def _wan(models_dir: Path) -> VideoEngine:
    config = {
        "model": "tiny:wan",
        "models_dir": str(models_dir),
        "max_sequence_length": 32,
        "defaults": {
            "width": 32,
            "height": 32,
            "num_frames": 9,
            "fps": 8,
            "num_inference_steps": 2,
        },
    }
    return registry.build_engine("video", "wan", config)


async def test_a_job_on_the_tiny_wan_pipeline_yields_an_h264_mp4(
    make_video_rig: RigFactory, tiny_video_models: Path
) -> None:
    rig = await make_video_rig(_wan(tiny_video_models))
    assert rig.core.info is not None and rig.core.info.size_multiple == 16
    created = await rig.create(width=32, height=32, num_frames=9, num_inference_steps=2, seed=5)
    job_id = created.json()["id"]
    assert await rig.core.run_once()
    job = await rig.job(job_id)
    assert job["status"] == "completed", job
    assert job["video"]["seconds"] == pytest.approx(9 / 8)
    download = await rig.download(job["video"]["url"])
    assert mp4_facts(download.content) == Mp4Facts("h264", 9, 32, 32)


async def test_the_wan_engine_is_seeded_and_stops_between_steps(tiny_video_models: Path) -> None:
    engine = _wan(tiny_video_models)
    info = await engine.start()
    params = resolve_params(VideoRequest(prompt="waves", negative_prompt="blur", seed=3), info)
    first = await engine.generate(params, lambda: False)
    again = await engine.generate(params, lambda: False)
    assert first.frames.shape == (9, 32, 32, 3) and first.frames.dtype == np.uint8
    assert np.array_equal(first.frames, again.frames)
    checks = []

    def stop_after_first_step() -> bool:
        checks.append(1)
        return len(checks) > 2  # one check before rendering, one after step 1

    with pytest.raises(GenerationCancelled):
        await engine.generate(params, stop_after_first_step)
    assert len(checks) == 3


async def test_the_ltx_backend_runs_its_pipeline_on_a_tiny_ltx_model(
    make_video_rig: RigFactory, tiny_video_models: Path
) -> None:
    """The GPU backend's code (LTXPipeline, frame_rate, decode timestep) on CPU weights."""
    engine = registry.build_engine(
        "video",
        "ltx",
        {
            "model": "tiny:ltx",
            "models_dir": str(tiny_video_models),
            "max_sequence_length": 16,
            "defaults": {"width": 64, "height": 32, "num_frames": 9, "num_inference_steps": 2},
        },
    )
    rig = await make_video_rig(engine)
    assert rig.core.info is not None and rig.core.info.size_multiple == 32
    job_id = (await rig.create(width=70, fps=12)).json()["id"]  # 70 -> 64 (blocks of 32)
    assert await rig.core.run_once()
    job = await rig.job(job_id)
    assert job["status"] == "completed", job
    assert job["video"]["seconds"] == pytest.approx(9 / 12)
    download = await rig.download(job["video"]["url"])
    assert mp4_facts(download.content) == Mp4Facts("h264", 9, 64, 32)


def test_the_tiny_model_is_built_once(tmp_path: Path) -> None:
    target = ensure_tiny_wan(tmp_path / "tiny-wan")
    marker = (target / ".prepared.json").stat().st_mtime_ns
    weights = sorted(p.name for p in target.rglob("*.safetensors"))
    assert weights == [
        "diffusion_pytorch_model.safetensors",
        "diffusion_pytorch_model.safetensors",
        "model.safetensors",
    ]
    assert ensure_tiny_wan(target) == target
    assert (target / ".prepared.json").stat().st_mtime_ns == marker


@pytest.mark.parametrize(("height", "width"), [(16, 16), (33, 47)])
def test_mp4_encoding_keeps_every_frame(height: int, width: int) -> None:
    frames = np.random.default_rng(0).integers(0, 255, (12, height, width, 3), dtype=np.uint8)
    data = encode_mp4(frames, 12)
    facts = mp4_facts(data)
    assert (facts.codec, facts.frames) == ("h264", 12)
    assert (facts.width, facts.height) == (width + width % 2, height + height % 2)


def test_mp4_encoding_refuses_non_rgb_input() -> None:
    with pytest.raises(ValueError):
        encode_mp4(np.zeros((3, 8, 8), dtype=np.uint8), 8)


CONFIGS = {"wan": DiffusersVideoConfig, "ltx": LtxVideoConfig}


@pytest.mark.parametrize("name", ["local.yaml", "production.yaml"])
def test_every_shipped_video_model_has_a_valid_engine_config(name: str) -> None:
    data = yaml.safe_load((REPO_ROOT / "configs" / "catalog" / name).read_text())
    videos = [CatalogModel.model_validate(m) for m in data["models"] if m["head"] == "video"]
    assert videos
    for model in videos:
        config = CONFIGS[model.engine.backend].model_validate(model.engine.config)
        assert config.defaults.num_frames % 8 == 1, model.id
        assert model.pricing.per_video_second is not None


def test_gateway_run_prepares_the_tiny_video_models_its_config_names() -> None:
    from serve_app.cli.serve import tiny_video_models
    from serve_app.cli.serve_config import load_serve_config

    assert tiny_video_models(load_serve_config("configs/local.yaml")) == [("tiny:wan", None)]
    assert tiny_video_models(load_serve_config("configs/production.yaml")) == []
