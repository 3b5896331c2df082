"""Request ids: one per request a service sends to a head, ``<prefix>-<32 hex digits>``."""

from __future__ import annotations

import uuid


def new_request_id(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex}"
