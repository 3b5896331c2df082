"""Document backends on transformers: the GPU heads, and their CPU test path.

The same code serves the real checkpoints on a GPU (``model:
microsoft/table-transformer-detection``, ``microsoft/trocr-base-handwritten``,
``google/deplot``, ``breezedeus/pix2text-mfr``, ``stepfun-ai/GOT-OCR-2.0-hf``)
and the tiny random-weight models of ``tiny_document_models`` on a CPU
(``model: "tiny:<kind>"``), so loading, preprocessing, generation and
post-processing are exercised without a hub or a GPU.

* ``table-transformer``: ``TableTransformerForObjectDetection`` + its DETR
  image processor; boxes are rescaled to the image as sent.
* ``vision-encoder-decoder``: TrOCR and pix2text-MFR (ViT/Swin encoder, text
  decoder) read one line or one formula with ``generate``.
* ``pix2struct``: DePlot; its VQA header is rendered here with a local font
  because transformers would otherwise download Arial from the hub.
* ``got-ocr-2``: GOT-OCR 2.0 as ``AutoModelForImageTextToText`` (GPU only;
  the CPU catalog serves ``got-ocr-2`` with RapidOCR).
"""

from __future__ import annotations

import asyncio
import math
import threading
from typing import TYPE_CHECKING, Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from deployments.documents.base import (
    DetectEngine,
    ParseEngine,
    ParseEngineInfo,
    ParseOptions,
    ParseOutput,
)
from deployments.local_models.resolve import resolve_model
from serve_app.contract.documents import ParseField, Region

if TYPE_CHECKING:
    from PIL import Image

DEPLOT_HEADER = "Generate underlying data table of the figure below:"
MAX_RENDER_PIXELS = 8_000_000
"""Bound of Pix2Struct's header + image rendering (its input is ~0.5 MP of patches)."""


class HfDocumentConfig(BaseModel):
    """A transformers checkpoint (hub id, folder, or ``tiny:<kind>``) and where to run it."""

    model_config = ConfigDict(extra="forbid")

    model: str
    device: Literal["auto", "cpu", "cuda"] = "auto"
    dtype: Literal["float32", "float16", "bfloat16"] = "float32"
    models_dir: str | None = None
    """Where ``tiny:`` models are built (default ``<state_dir>/models``)."""
    field: ParseField = "text"
    """The parse result field this model fills (detect engines ignore it)."""
    threshold: float = Field(default=0.7, ge=0, le=1)
    """Detection score threshold."""
    header: str = DEPLOT_HEADER
    """Pix2Struct VQA prompt rendered above the image."""
    font_path: str | None = None
    """Font for that header; default: DejaVu Sans if installed, else Pillow's own."""


class _HfModel:
    """Loads a checkpoint once and runs it in a worker thread, one call at a time."""

    def __init__(self, config: HfDocumentConfig) -> None:
        self.config = config
        self.model: Any = None
        self.processor: Any = None
        self.tokenizer: Any = None
        self.device = "cpu"
        self.lock = threading.Lock()

    def path(self) -> str:
        from pathlib import Path

        folder = Path(self.config.models_dir) if self.config.models_dir else None
        return resolve_model(self.config.model, folder)

    def place(self, model: Any) -> Any:
        import torch

        cuda = torch.cuda.is_available()
        self.device = (
            "cuda"
            if self.config.device == "cuda" or (self.config.device == "auto" and cuda)
            else "cpu"
        )
        dtype = getattr(torch, self.config.dtype)
        return model.to(device=self.device, dtype=dtype).eval()

    def inputs(self, batch: Any) -> Any:
        import torch

        dtype = getattr(torch, self.config.dtype)
        moved = batch.to(self.device)
        for key, value in moved.items():
            if torch.is_floating_point(value):
                moved[key] = value.to(dtype)
        return moved


class TableTransformerDetectEngine(DetectEngine):
    """Table regions from Table Transformer (DETR) object detection."""

    def __init__(self, config: HfDocumentConfig) -> None:
        self.hf = _HfModel(config)

    async def start(self) -> None:
        await asyncio.to_thread(self._load)

    def _load(self) -> None:
        from transformers import AutoImageProcessor, TableTransformerForObjectDetection

        path = self.hf.path()
        self.hf.processor = AutoImageProcessor.from_pretrained(path)
        self.hf.model = self.hf.place(TableTransformerForObjectDetection.from_pretrained(path))

    async def detect(self, image: Image.Image) -> list[Region]:
        return await asyncio.to_thread(self._detect, image)

    def _detect(self, image: Image.Image) -> list[Region]:
        import torch

        hf = self.hf
        with hf.lock, torch.inference_mode():
            batch = hf.inputs(hf.processor(images=image.convert("RGB"), return_tensors="pt"))
            outputs = hf.model(**batch)
            found = hf.processor.post_process_object_detection(
                outputs, threshold=hf.config.threshold, target_sizes=[(image.height, image.width)]
            )[0]
        labels = hf.model.config.id2label
        regions = [
            Region(
                label=str(labels.get(int(label), label)),
                score=round(float(score), 4),
                box=[round(float(v), 1) for v in box.tolist()],
            )
            for score, label, box in zip(
                found["scores"], found["labels"], found["boxes"], strict=True
            )
        ]
        return sorted(regions, key=lambda r: -r.score)


class VisionEncoderDecoderParseEngine(ParseEngine):
    """TrOCR (handwriting) and pix2text-MFR (formula to LaTeX)."""

    def __init__(self, config: HfDocumentConfig) -> None:
        self.hf = _HfModel(config)

    async def start(self) -> ParseEngineInfo:
        await asyncio.to_thread(self._load)
        return ParseEngineInfo(field=self.hf.config.field)

    def _load(self) -> None:
        from transformers import AutoImageProcessor, AutoTokenizer, VisionEncoderDecoderModel

        path = self.hf.path()
        self.hf.processor = AutoImageProcessor.from_pretrained(path)
        self.hf.tokenizer = AutoTokenizer.from_pretrained(path)
        self.hf.model = self.hf.place(VisionEncoderDecoderModel.from_pretrained(path))

    async def parse(self, image: Image.Image, options: ParseOptions) -> ParseOutput:
        return ParseOutput(value=await asyncio.to_thread(self._read, image, options))

    def _read(self, image: Image.Image, options: ParseOptions) -> str:
        """Greedy decoding, never past the decoder's learned positions (it would index out)."""
        import torch

        hf = self.hf
        with hf.lock, torch.inference_mode():
            batch = hf.inputs(hf.processor(images=image.convert("RGB"), return_tensors="pt"))
            limit = getattr(hf.model.config.decoder, "max_position_embeddings", None)
            steps = min(options.max_new_tokens, limit - 2) if limit else options.max_new_tokens
            ids = hf.model.generate(batch["pixel_values"], max_new_tokens=steps)
        return str(hf.tokenizer.batch_decode(ids, skip_special_tokens=True)[0]).strip()


class Pix2StructParseEngine(ParseEngine):
    """DePlot (chart to linearized data table) on Pix2Struct."""

    def __init__(self, config: HfDocumentConfig) -> None:
        self.hf = _HfModel(config)
        self._font: Any = None

    async def start(self) -> ParseEngineInfo:
        await asyncio.to_thread(self._load)
        return ParseEngineInfo(field=self.hf.config.field)

    def _load(self) -> None:
        from transformers import AutoImageProcessor, AutoTokenizer
        from transformers import Pix2StructForConditionalGeneration as Model

        path = self.hf.path()
        self.hf.processor = AutoImageProcessor.from_pretrained(path)
        self.hf.tokenizer = AutoTokenizer.from_pretrained(path)
        self.hf.model = self.hf.place(Model.from_pretrained(path))
        self._font = local_font(self.hf.config.font_path, 24)

    async def parse(self, image: Image.Image, options: ParseOptions) -> ParseOutput:
        return ParseOutput(value=await asyncio.to_thread(self._read, image, options))

    def _read(self, image: Image.Image, options: ParseOptions) -> str:
        import torch

        hf = self.hf
        picture = image.convert("RGB")
        if hf.model.config.is_vqa:
            picture = render_header(picture, hf.config.header, self._font)
        with hf.lock, torch.inference_mode():
            batch = hf.processor(images=picture, is_vqa=False, return_tensors="pt")
            ids = hf.model.generate(**hf.inputs(batch), max_new_tokens=options.max_new_tokens)
        return str(hf.tokenizer.batch_decode(ids, skip_special_tokens=True)[0]).strip()


class GotOcr2ParseEngine(ParseEngine):
    """GOT-OCR 2.0 plain-text OCR (GPU backend of ``got-ocr-2``)."""

    def __init__(self, config: HfDocumentConfig) -> None:
        self.hf = _HfModel(config)

    async def start(self) -> ParseEngineInfo:
        await asyncio.to_thread(self._load)
        return ParseEngineInfo(field="text")

    def _load(self) -> None:
        from transformers import AutoModelForImageTextToText, AutoProcessor

        path = self.hf.path()
        self.hf.processor = AutoProcessor.from_pretrained(path)
        self.hf.model = self.hf.place(AutoModelForImageTextToText.from_pretrained(path))

    async def parse(self, image: Image.Image, options: ParseOptions) -> ParseOutput:
        return ParseOutput(value=await asyncio.to_thread(self._read, image, options))

    def _read(self, image: Image.Image, options: ParseOptions) -> str:
        import torch

        hf = self.hf
        with hf.lock, torch.inference_mode():
            batch = hf.inputs(hf.processor(image.convert("RGB"), return_tensors="pt"))
            ids = hf.model.generate(
                **batch,
                do_sample=False,
                tokenizer=hf.processor.tokenizer,
                stop_strings="<|im_end|>",
                max_new_tokens=options.max_new_tokens,
            )
        prompt_len = batch["input_ids"].shape[1]
        return str(hf.processor.decode(ids[0, prompt_len:], skip_special_tokens=True)).strip()


def local_font(path: str | None, size: int) -> Any:
    """A TrueType font from disk: the configured one, DejaVu Sans, or Pillow's built-in."""
    from PIL import ImageFont

    for candidate in (path, "DejaVuSans.ttf", "/usr/share/fonts/truetype/dejavu/DejaVuSans.ttf"):
        if candidate:
            try:
                return ImageFont.truetype(candidate, size)
            except OSError:
                continue
    return ImageFont.load_default(size)


def render_header(image: Image.Image, header: str, font: Any) -> Image.Image:
    """Pix2Struct's VQA input: the prompt rendered above the image, same width."""
    import textwrap

    from PIL import Image as PilImage
    from PIL import ImageDraw

    text = textwrap.fill(header, width=80)
    probe = ImageDraw.Draw(PilImage.new("RGB", (1, 1)))
    _, _, text_w, text_h = probe.textbbox((0, 0), text, font=font)
    banner = PilImage.new("RGB", (int(text_w) + 10, int(text_h) + 10), "white")
    ImageDraw.Draw(banner).text((5, 5), text, fill="black", font=font)
    width = max(banner.width, image.width)
    top_h = max(1, int(banner.height * width / banner.width))
    body_h = max(1, int(image.height * width / image.width))
    # A narrow image scaled up to the header's width could reach gigapixels; the
    # processor shrinks the result to its patch budget anyway, so bound it first.
    scale = min(1.0, math.sqrt(MAX_RENDER_PIXELS / (width * (top_h + body_h))))
    width, top_h, body_h = (max(1, int(v * scale)) for v in (width, top_h, body_h))
    top = banner.resize((width, top_h))
    body = image.resize((width, body_h))
    out = PilImage.new("RGB", (width, top.height + body.height), "white")
    out.paste(top, (0, 0))
    out.paste(body, (0, top.height))
    return out
