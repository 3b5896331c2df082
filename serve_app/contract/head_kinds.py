"""The one declared table of head kinds: everything both sides must agree on per kind.

A head kind is what a catalog entry's ``head`` names: which route family serves the
model, what crosses its DeploymentHandle, which Serve deployment and engine contract
run it, how the gateway's head client reaches it and what it is billed by. Before this
table the kinds were listed five times (the backend registry, the catalog's config and
cards, the app builder, the head client); now each of those reads ``HEAD_KINDS`` and
``tests/unit/test_head_kinds.py`` fails when a kind is registered on one side only.

The contract imports neither side, so what lives in ``deployments`` (the deployment
class, the engine contract) is held here as a ``module:Class`` path that the app builder
and the backend registry import; what lives in the gateway (the client's methods, the
field of ``HeadClients``) is held as names. The request and reply types are the
contract's own and are referenced directly.

Adding a head kind, step by step: docs/extending.md#adding-a-head-kind.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal, get_args

from serve_app.contract.audio import (
    SpeechHeadRequest,
    SpeechHeadResult,
    TranscriptionHeadRequest,
    TranscriptionHeadResult,
)
from serve_app.contract.chat import HeadEvent, HeadRequest
from serve_app.contract.documents import (
    DetectHeadRequest,
    DetectHeadResult,
    ParseHeadRequest,
    ParseHeadResult,
)
from serve_app.contract.embeddings import (
    ONE_ITEM_STREAM,
    EmbedHeadRequest,
    EmbedHeadResult,
    ScoreHeadRequest,
    ScoreHeadResult,
)
from serve_app.contract.video import VideoRequest

HeadKind = Literal["chat", "speech", "transcription", "video", "detect", "parse", "pooling"]
"""A catalog entry's ``head`` (pydantic validates it; ``HEAD_KINDS`` must list the same)."""

BillingUnit = Literal["token", "audio_second", "image", "video_second"]
"""What a kind's usage record is priced by: ``token`` (``input_per_mtok`` and
``output_per_mtok``), else the ``per_<unit>`` price of ``PricingConfig``."""


@dataclass(frozen=True)
class HeadKindSpec:
    """One head kind, from the route family that serves it to the engine that runs it."""

    name: HeadKind
    family: str
    """The API family: ``serve_app/inference/<family>/`` holds its service."""
    route: str
    """The route that serves its models (named when a model is used on another route)."""
    requests: tuple[type, ...]
    """The contract's values the gateway sends it (a video job's: stored, not sent)."""
    replies: tuple[type, ...]
    """What it answers with (beside a ``HeadFailure``; a chat head: a stream of events)."""
    deployment: str
    """``module:Class`` of its Ray Serve deployment in ``deployments``."""
    engine: str
    """``module:Class`` of the engine contract its backends implement (the registry builds
    one by backend name)."""
    clients: str
    """The field of ``serve_app.heads.client.HeadClients`` its clients are filed under."""
    client_methods: tuple[str, ...]
    """What the gateway calls on its head client (``RayHeadClient`` offers each)."""
    head_methods: tuple[str, ...]
    """What those calls invoke on the deployment (the deployment defines each)."""
    billing_unit: BillingUnit
    dedicated: bool = False
    """Whether a dedicated endpoint may be backed by a model of this kind."""


_CHAT = "deployments.chat"
_AUDIO = "deployments.audio"
_DOCUMENT = "deployments.documents"
_EMBEDDING = "deployments.embeddings"
_VIDEO = "deployments.video"

HEAD_KINDS: tuple[HeadKindSpec, ...] = (
    HeadKindSpec(
        name="chat",
        family="chat",
        route="/v1/chat/completions",
        requests=(HeadRequest,),
        replies=get_args(HeadEvent),
        deployment=f"{_CHAT}.head:ChatHead",
        engine=f"{_CHAT}.base:TextEngine",
        clients="chat",
        client_methods=("stream", "forget_adapter", "adapter_base"),
        head_methods=("generate", "forget_adapter", "adapter_base"),
        billing_unit="token",
        dedicated=True,
    ),
    HeadKindSpec(
        name="speech",
        family="audio",
        route="/v1/audio/speech",
        requests=(SpeechHeadRequest,),
        replies=(SpeechHeadResult,),
        deployment=f"{_AUDIO}.speech_head:SpeechHead",
        engine=f"{_AUDIO}.base:SpeechEngine",
        clients="speech",
        client_methods=("synthesize",),
        head_methods=("synthesize",),
        billing_unit="audio_second",
    ),
    HeadKindSpec(
        name="transcription",
        family="audio",
        route="/v1/audio/transcriptions",
        requests=(TranscriptionHeadRequest,),
        replies=(TranscriptionHeadResult,),
        deployment=f"{_AUDIO}.transcription_head:TranscriptionHead",
        engine=f"{_AUDIO}.base:TranscriptionEngine",
        clients="transcription",
        client_methods=("transcribe",),
        head_methods=("transcribe",),
        billing_unit="audio_second",
    ),
    HeadKindSpec(
        name="video",
        family="video",
        route="/v1/video/generations",
        requests=(VideoRequest,),
        replies=(),
        deployment=f"{_VIDEO}.head:VideoHead",
        engine=f"{_VIDEO}.base:VideoEngine",
        clients="video",
        client_methods=("wake",),
        head_methods=("wake",),
        billing_unit="video_second",
    ),
    HeadKindSpec(
        name="detect",
        family="documents",
        route="/v1/detect",
        requests=(DetectHeadRequest,),
        replies=(DetectHeadResult,),
        deployment=f"{_DOCUMENT}.head:DetectHead",
        engine=f"{_DOCUMENT}.base:DetectEngine",
        clients="documents",
        client_methods=("detect",),
        head_methods=("detect",),
        billing_unit="image",
    ),
    HeadKindSpec(
        name="parse",
        family="documents",
        route="/v1/parse",
        requests=(ParseHeadRequest,),
        replies=(ParseHeadResult,),
        deployment=f"{_DOCUMENT}.head:ParseHead",
        engine=f"{_DOCUMENT}.base:ParseEngine",
        clients="documents",
        client_methods=("parse",),
        head_methods=("parse",),
        billing_unit="image",
    ),
    HeadKindSpec(
        name="pooling",
        family="embeddings",
        route="/v1/embeddings",
        requests=(EmbedHeadRequest, ScoreHeadRequest),
        replies=(EmbedHeadResult, ScoreHeadResult),
        deployment=f"{_EMBEDDING}.head:PoolingHead",
        engine=f"{_EMBEDDING}.base:PoolingEngine",
        clients="pooling",
        client_methods=("embed", "score"),
        head_methods=("embed", "score", ONE_ITEM_STREAM),
        billing_unit="token",
        dedicated=True,
    ),
)
"""Every head kind, in the order the catalog's ``HeadKind`` names them."""

BY_NAME: dict[str, HeadKindSpec] = {spec.name: spec for spec in HEAD_KINDS}


def head_kind(name: str) -> HeadKindSpec:
    """The row of the kind ``name`` (``KeyError`` for a name the table does not hold)."""
    return BY_NAME[name]
