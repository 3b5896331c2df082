"""Tiny random-weight document models built locally, for CPU runs and tests.

No model hub is reachable here and no package ships Table Transformer, TrOCR,
DePlot or pix2text weights, yet those heads must answer through their real
transformers code (loading, preprocessing, ``generate``, post-processing).
So each is built once from a small config with random weights and a
tokenizer trained locally with ``tokenizers``, saved with ``save_pretrained``
into ``<state_dir>/models/tiny-<kind>``, and then loaded exactly as the real
checkpoint is on a GPU. The output is random; the code path is not.

``model: "tiny:<kind>"`` in an engine config names such a folder. Builds are
atomic and locked (``model_prep.build_atomically``), seeded, and skipped when
a finished build of the same recipe version is already there.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from deployments.local_models.tiny_models import bpe_tokenizer, ensure_tiny_model

__all__ = ["TINY_KINDS", "ensure_tiny"]

RECIPE_VERSION = "1"
TINY_KINDS = (
    "table-transformer",
    "table-transformer-timm",
    "vision-encoder-decoder",
    "pix2struct",
)
_CORPUS = [
    "Generate underlying data table of the figure below:",
    "TITLE | Sales <0x0A> Year | Value <0x0A> 2021 | 12 <0x0A> 2022 | 15",
    "\\frac { a } { b } + \\sqrt { x ^ { 2 } } = \\alpha _ { 1 }",
    "the quick brown fox jumps over the lazy dog 0123456789",
]


def ensure_tiny(kind: str, target: Path) -> Path:
    """Build the tiny ``kind`` model into ``target`` unless it is already there."""
    return ensure_tiny_model(kind, target, _BUILDERS[kind], RECIPE_VERSION)


def _tokenizer(vocab_size: int = 160) -> Any:
    return bpe_tokenizer(_CORPUS, vocab_size, bos=True)


_TINY_DETR: dict[str, Any] = {
    "d_model": 16,
    "encoder_layers": 1,
    "decoder_layers": 1,
    "encoder_attention_heads": 2,
    "decoder_attention_heads": 2,
    "encoder_ffn_dim": 32,
    "decoder_ffn_dim": 32,
    "num_queries": 8,
    "id2label": {0: "table", 1: "table rotated"},
    "label2id": {"table": 0, "table rotated": 1},
}
"""The DETR head both table-transformer demos share; only their backbones differ."""


def _save_detr(config: Any, out: Path) -> None:
    """Save a table-transformer of ``config`` with seeded random weights (the caller seeds)
    and the image processor the detect engine loads beside it."""
    from transformers import DetrImageProcessor, TableTransformerForObjectDetection

    TableTransformerForObjectDetection(config).eval().save_pretrained(out)
    DetrImageProcessor(size={"shortest_edge": 128, "longest_edge": 256}).save_pretrained(out)


def _build_table_transformer(out: Path) -> None:
    import torch
    from transformers import ResNetConfig, TableTransformerConfig

    torch.manual_seed(0)
    # Some keyword arguments are read by the config classes' ``**kwargs`` only, so they
    # go through a dict: a transformers backbone (no timm), not pretrained (no hub).
    backbone_args: dict[str, Any] = {
        "embedding_size": 8,
        "hidden_sizes": [8, 8, 16, 16],
        "depths": [1, 1, 1, 1],
        "out_features": ["stage4"],
    }
    detr_args: dict[str, Any] = {"use_timm_backbone": False, "use_pretrained_backbone": False}
    config = TableTransformerConfig(
        **detr_args,
        backbone_config=ResNetConfig(**backbone_args),
        **_TINY_DETR,
    )
    _save_detr(config, out)


def _build_table_transformer_timm(out: Path) -> None:
    """The published checkpoint's shape: ``use_timm_backbone: true`` (a timm ResNet).

    microsoft/table-transformer-detection's config asks transformers for a timm backbone,
    so loading it needs ``timm``; this model makes that path testable without the hub.
    """
    import torch
    from transformers import TableTransformerConfig

    torch.manual_seed(0)
    detr_args: dict[str, Any] = {
        "use_timm_backbone": True,
        "backbone": "resnet10t",  # timm's smallest ResNet (the checkpoint names resnet18)
        "use_pretrained_backbone": False,
        "backbone_config": None,
    }
    config = TableTransformerConfig(
        **detr_args,
        **_TINY_DETR,
    )
    _save_detr(config, out)
    # Written the way the published config.json is (transformers 5 saves a nested
    # timm_backbone config instead), so loading goes through the same conversion.
    saved = json.loads((out / "config.json").read_text())
    saved.pop("backbone_config", None)
    saved.update(
        use_timm_backbone=True,
        backbone="resnet10t",
        use_pretrained_backbone=False,
        num_channels=3,
        dilation=False,
    )
    (out / "config.json").write_text(json.dumps(saved, indent=2))


def _build_vision_encoder_decoder(out: Path) -> None:
    import torch
    from transformers import (
        TrOCRConfig,
        VisionEncoderDecoderConfig,
        VisionEncoderDecoderModel,
        ViTConfig,
        ViTImageProcessor,
    )

    torch.manual_seed(0)
    tokenizer = _tokenizer()
    encoder = ViTConfig(
        image_size=32,
        patch_size=8,
        hidden_size=16,
        num_hidden_layers=1,
        num_attention_heads=2,
        intermediate_size=32,
    )
    decoder = TrOCRConfig(
        vocab_size=len(tokenizer),
        d_model=16,
        decoder_layers=1,
        decoder_attention_heads=2,
        decoder_ffn_dim=32,
        max_position_embeddings=256,
        pad_token_id=tokenizer.pad_token_id,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        decoder_start_token_id=tokenizer.bos_token_id,
    )
    config = VisionEncoderDecoderConfig.from_encoder_decoder_configs(encoder, decoder)
    config.decoder_start_token_id = tokenizer.bos_token_id
    config.pad_token_id = tokenizer.pad_token_id
    config.eos_token_id = tokenizer.eos_token_id
    VisionEncoderDecoderModel(config=config).eval().save_pretrained(out)
    ViTImageProcessor(size={"height": 32, "width": 32}).save_pretrained(out)
    tokenizer.save_pretrained(out)


def _build_pix2struct(out: Path) -> None:
    import torch
    from transformers import (
        Pix2StructConfig,
        Pix2StructForConditionalGeneration,
        Pix2StructImageProcessor,
        Pix2StructTextConfig,
        Pix2StructVisionConfig,
    )

    torch.manual_seed(0)
    tokenizer = _tokenizer()
    text = Pix2StructTextConfig(
        vocab_size=len(tokenizer),
        hidden_size=16,
        d_kv=8,
        d_ff=32,
        num_layers=1,
        num_heads=2,
        pad_token_id=tokenizer.pad_token_id,
        eos_token_id=tokenizer.eos_token_id,
        decoder_start_token_id=tokenizer.pad_token_id,
    )
    patch: dict[str, Any] = {"patch_size": 16}
    vision = Pix2StructVisionConfig(
        hidden_size=16,
        patch_embed_hidden_size=16 * 16 * 3,  # one flattened RGB patch
        d_ff=32,
        d_kv=8,
        num_hidden_layers=1,
        num_attention_heads=2,
        **patch,
    )
    config = Pix2StructConfig(
        text_config=text.to_dict(), vision_config=vision.to_dict(), is_vqa=True
    )
    Pix2StructForConditionalGeneration(config).eval().save_pretrained(out)
    Pix2StructImageProcessor(
        is_vqa=True, max_patches=64, patch_size={"height": 16, "width": 16}
    ).save_pretrained(out)
    tokenizer.save_pretrained(out)


_BUILDERS = {
    "table-transformer": _build_table_transformer,
    "table-transformer-timm": _build_table_transformer_timm,
    "vision-encoder-decoder": _build_vision_encoder_decoder,
    "pix2struct": _build_pix2struct,
}
