"""``x-service-replica`` names the answering gateway replica on every kind of answer."""

from __future__ import annotations

import httpx
from fastapi import FastAPI
from fastapi.responses import JSONResponse, StreamingResponse

from serve_app.ingress.replica_header import REPLICA_HEADER, ReplicaHeaderMiddleware


def _app() -> FastAPI:
    app = FastAPI()

    @app.get("/ok")
    async def ok() -> dict[str, str]:
        return {"ok": "yes"}

    @app.get("/refused")
    async def refused() -> JSONResponse:
        return JSONResponse({"error": {"code": "rate_limit_exceeded"}}, status_code=429)

    @app.get("/stream")
    async def stream() -> StreamingResponse:
        async def frames():  # type: ignore[no-untyped-def]
            yield b"data: 1\n\n"

        return StreamingResponse(frames(), media_type="text/event-stream")

    app.add_middleware(ReplicaHeaderMiddleware, replica="ab12cd34")
    return app


async def test_every_answer_names_the_replica_once() -> None:
    transport = httpx.ASGITransport(app=_app())
    async with httpx.AsyncClient(transport=transport, base_url="http://t") as http:
        for path, status in (("/ok", 200), ("/refused", 429), ("/stream", 200), ("/nope", 404)):
            resp = await http.get(path)
            assert resp.status_code == status
            assert resp.headers.get_list(REPLICA_HEADER) == ["ab12cd34"], path
