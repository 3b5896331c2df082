"""Liveness for load balancers: no key needed, no model touched."""

from __future__ import annotations

from fastapi import APIRouter

router = APIRouter(tags=["health"])


@router.get("/healthz", summary="Gateway liveness")
async def healthz() -> dict[str, str]:
    return {"status": "ok"}
