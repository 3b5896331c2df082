"""Tiny random-weight text-to-video pipelines built locally, for CPU runs and tests.

No package ships text-to-video weights and no model hub is reachable here, yet
the video head must run a real diffusers pipeline: tokenizer, UMT5 text
encoder, a ``WanTransformer3DModel`` denoising latents step by step under a
flow-matching scheduler, and the ``AutoencoderKLWan`` decoding them to frames.
So the same classes as Wan 2.1 are built once from small configs with seeded
random weights and a byte-level BPE tokenizer trained with ``tokenizers``,
saved with ``save_pretrained`` into ``<state_dir>/models/tiny-wan``, and then
loaded with ``WanPipeline.from_pretrained`` exactly as a real checkpoint is.
The frames are noise-like; the code path is the production one.

``tiny:ltx`` does the same for the GPU backend's ``LTXPipeline`` (T5 encoder,
LTX transformer, LTX VAE with LTX-Video's 32x spatial / 8x temporal
compression), so the LTX-Video code path runs on a CPU in the tests even
though the real checkpoint needs a GPU.

``model: "tiny:<kind>"`` in an engine config names such a folder
(``<models_dir>/tiny-<kind>``). Builds are atomic and locked
(``model_prep.build_atomically``) and skipped when a finished build of the
same recipe is already there; each step is logged.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

from deployments.local_models.tiny_models import bpe_tokenizer, ensure_tiny_model

logger = logging.getLogger(__name__)

__all__ = ["TINY_KINDS", "ensure_tiny_video", "ensure_tiny_wan"]

TINY_WAN = "wan"
TINY_LTX = "ltx"
TINY_KINDS = (TINY_WAN, TINY_LTX)
RECIPE_VERSION = "1"
_STEPS = 4
_CORPUS = [
    "a cat playing the piano in the snow, cinematic lighting",
    "waves breaking on a rocky shore at sunset, slow motion",
    "a red car driving through a neon city at night, rain",
    "blurry, low quality, distorted, watermark, text",
]


def ensure_tiny_video(kind: str, target: Path) -> Path:
    """Build the tiny ``kind`` pipeline into ``target`` unless it is already there."""
    return ensure_tiny_model(kind, target, _BUILDERS[kind], RECIPE_VERSION)


def ensure_tiny_wan(target: Path) -> Path:
    """Build the tiny Wan pipeline (the CPU default) into ``target`` unless it is there."""
    return ensure_tiny_video(TINY_WAN, target)


def _tokenizer() -> Any:
    return bpe_tokenizer(_CORPUS, 320, bos=False)


def _text_encoder_args(tokenizer: Any) -> dict[str, Any]:
    """One small T5-family encoder config (UMT5 for Wan, T5 for LTX): 32 wide, one layer."""
    return {
        "vocab_size": len(tokenizer),
        "d_model": 32,
        "d_kv": 8,
        "d_ff": 64,
        "num_layers": 1,
        "num_heads": 4,
        "relative_attention_num_buckets": 8,
        "pad_token_id": tokenizer.pad_token_id,
        "eos_token_id": tokenizer.eos_token_id,
    }


def _build_wan(out: Path) -> None:
    import torch
    from diffusers import (
        AutoencoderKLWan,
        FlowMatchEulerDiscreteScheduler,
        WanPipeline,
        WanTransformer3DModel,
    )
    from transformers import UMT5Config, UMT5EncoderModel

    torch.manual_seed(0)
    logger.info("[1/%d] training the tokenizer", _STEPS)
    tokenizer = _tokenizer()
    logger.info("[2/%d] UMT5 text encoder (vocab %d)", _STEPS, len(tokenizer))
    text_encoder = UMT5EncoderModel(UMT5Config(**_text_encoder_args(tokenizer)))
    logger.info("[3/%d] Wan transformer and VAE", _STEPS)
    # Spatial downscale 8 (three 2x stages) x patch 2 = blocks of 16 pixels; temporal 4.
    vae: Any = AutoencoderKLWan(
        base_dim=3,
        z_dim=16,
        dim_mult=[1, 1, 1, 1],
        num_res_blocks=1,
        temperal_downsample=[False, True, True],
    )
    transformer: Any = WanTransformer3DModel(
        patch_size=(1, 2, 2),
        num_attention_heads=2,
        attention_head_dim=12,
        in_channels=16,
        out_channels=16,
        text_dim=32,
        freq_dim=256,
        ffn_dim=32,
        num_layers=2,
        cross_attn_norm=True,
        qk_norm="rms_norm_across_heads",
        rope_max_seq_len=1024,  # rotary table long enough for 704 / 16 = 44 patches
    )
    pipeline: Any = WanPipeline(
        tokenizer=tokenizer,
        text_encoder=text_encoder.eval(),
        vae=vae.eval(),
        scheduler=FlowMatchEulerDiscreteScheduler(shift=7.0),
        transformer=transformer.eval(),
    )
    logger.info("[4/%d] saving the pipeline to %s", _STEPS, out)
    pipeline.save_pretrained(out, safe_serialization=True)
    _readable(out)


def _build_ltx(out: Path) -> None:
    import torch
    from diffusers import (
        AutoencoderKLLTXVideo,
        FlowMatchEulerDiscreteScheduler,
        LTXPipeline,
        LTXVideoTransformer3DModel,
    )
    from transformers import T5Config, T5EncoderModel

    torch.manual_seed(0)
    logger.info("[1/%d] training the tokenizer", _STEPS)
    tokenizer = _tokenizer()
    logger.info("[2/%d] T5 text encoder (vocab %d)", _STEPS, len(tokenizer))
    text_encoder = T5EncoderModel(T5Config(**_text_encoder_args(tokenizer)))
    logger.info("[3/%d] LTX transformer and VAE", _STEPS)
    # Patch 4 x three 2x stages = 32x spatial, three temporal stages = 8x: LTX-Video's ratios.
    vae: Any = AutoencoderKLLTXVideo(
        latent_channels=8,
        block_out_channels=(8, 8, 8, 8),
        decoder_block_out_channels=(8, 8, 8, 8),
        layers_per_block=(1, 1, 1, 1, 1),
        decoder_layers_per_block=(1, 1, 1, 1, 1),
        spatio_temporal_scaling=(True, True, True, False),
        decoder_spatio_temporal_scaling=(True, True, True, False),
        decoder_inject_noise=(False, False, False, False, False),
        patch_size=4,
        patch_size_t=1,
        timestep_conditioning=True,  # LTX-Video 0.9.1+: decode_timestep / decode_noise_scale act
    )
    transformer: Any = LTXVideoTransformer3DModel(
        in_channels=8,
        out_channels=8,
        patch_size=1,
        patch_size_t=1,
        num_attention_heads=4,
        attention_head_dim=8,
        cross_attention_dim=32,
        num_layers=1,
        caption_channels=32,
    )
    pipeline: Any = LTXPipeline(
        transformer=transformer.eval(),
        vae=vae.eval(),
        scheduler=FlowMatchEulerDiscreteScheduler(),
        text_encoder=text_encoder.eval(),
        tokenizer=tokenizer,
    )
    logger.info("[4/%d] saving the pipeline to %s", _STEPS, out)
    pipeline.save_pretrained(out, safe_serialization=True)
    _readable(out)


def _readable(out: Path) -> None:
    for path in out.rglob("*"):
        path.chmod(0o755 if path.is_dir() else 0o644)  # replicas may run as other users


_BUILDERS = {TINY_WAN: _build_wan, TINY_LTX: _build_ltx}
