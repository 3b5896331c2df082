"""Limits, usage records and metrics for requests answered by one head call (or one job).

Audio, document, embeddings and video requests share the chat routes' limiter, ledger
and metrics (one ``Metering`` per replica) but are shaped differently: the cost is
known, or bounded, before the head runs, so admission happens once before the call and
one record is written after it, whatever it is priced by: seconds of audio
(``per_audio_second``), processed images (``per_image``), seconds of video or the
input tokens of an embeddings call.
For audio, token counts are estimated from the text (docs/reference/audio.md: "metering is
estimated from the text"), so per-minute token limits and the daily quota count
audio requests too.
"""

from __future__ import annotations

import logging
import math
import time

from serve_app.billing.records import UsageQuantities
from serve_app.inference.metering import Metering, RequestMeta
from serve_app.limits.buckets import Ticket
from serve_app.protocol.errors import RateLimitError

logger = logging.getLogger(__name__)

CHARS_PER_TOKEN = 4
"""Rough English average; the audio models' own tokenizers are not in the gateway."""


def estimate_tokens(text: str) -> int:
    return math.ceil(len(text) / CHARS_PER_TOKEN) if text else 0


class UnaryMetering:
    """Admission before the head is called; one record and settlement after."""

    def __init__(self, metering: Metering) -> None:
        self.metering = metering

    async def admit(self, meta: RequestMeta, reserve_tokens: int) -> Ticket | None:
        """Reserve one request and ``reserve_tokens``, or raise the 429."""
        limiter = self.metering.limiter
        if limiter is None:
            return None
        try:
            return await limiter.admit(meta.principal, meta.request_id, reserve_tokens)
        except RateLimitError as err:
            metrics = self.metering.metrics
            metrics.rate_limited(meta.model.id, err.code or "rate_limit_exceeded")
            metrics.request(meta.model.id, meta.endpoint, "rejected")
            raise

    async def finish(
        self, meta: RequestMeta, ticket: Ticket | None, usage: UsageQuantities | None
    ) -> None:
        """Bill ``usage`` (None: the request failed, nothing billed) and settle the ticket."""
        metering = self.metering
        outcome = "ok" if usage is not None else "error"
        if usage is not None:
            self._submit(meta, usage)
            metering.metrics.tokens(meta.model.id, usage.prompt_tokens, usage.completion_tokens)
        metering.metrics.request(meta.model.id, meta.endpoint, outcome)
        metering.metrics.latency(meta.model.id, meta.endpoint, time.monotonic() - meta.started_at)
        if metering.limiter is not None:
            used = 0 if usage is None else usage.prompt_tokens + usage.completion_tokens
            await metering.limiter.settle(ticket, used)

    def _submit(self, meta: RequestMeta, usage: UsageQuantities) -> None:
        self.metering.record(meta, "ok", usage)
