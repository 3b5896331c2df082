"""Every head of the catalog called in turn, twice, under the heads' memory budget (issue 44).

Starts ``gateway run`` on CONFIG like ``bench/memory_budget.py`` (fresh state folder, the
shared models cache, ``GATEWAY_MEMORY_BUDGET`` from this environment), samples the stack's
PSS and the machine's used memory every 2 s, then calls each catalog head once through
its route (chat for chat models, embeddings, speech, transcription of the speech answer,
detect/parse of a small image, a video job), the whole list twice. A 503
``model_warming`` is waited out (its whole ``Retry-After``) and counted per call; every other answer
but 200/202 fails the run. Prints per call its status, the 503s and the seconds to the
answer, then the peak (stack PSS, machine used) and Ray's OOM kills (raylet log).

    flock /tmp/heavy.lock .venv/bin/python bench/every_route.py
    GATEWAY_MEMORY_BUDGET=8G flock /tmp/heavy.lock .venv/bin/python bench/every_route.py
"""

from __future__ import annotations

import argparse
import base64
import io
import signal
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from bench.memory_budget import (  # noqa: E402
    FIRST_MODEL,
    GiB,
    Sampler,
    chat,
    machine_used,
    oom_kills,
    start_gateway_run,
    stop_gateway_run,
    table,
    wait_ready,
)
from bench.servers import mint_key  # noqa: E402

Call = Callable[[httpx.Client, str], httpx.Response]
RETRY_AFTER_CAP_S = 300.0


def _png() -> str:
    from PIL import Image, ImageDraw

    image = Image.new("RGB", (256, 128), "white")
    ImageDraw.Draw(image).text((10, 50), "Total 42", fill="black")
    buffer = io.BytesIO()
    image.save(buffer, format="PNG")
    return "data:image/png;base64," + base64.b64encode(buffer.getvalue()).decode()


def calls(speech: dict[str, bytes], table_models: set[str]) -> dict[str, Call]:
    """Head kind -> one call of its route (``speech`` keeps the last WAV for transcription;
    ``table_models``: parse models that read tables in ``table_bboxes``, given the page)."""
    image = _png()

    def parse_call(http: httpx.Client, model: str) -> httpx.Response:
        body: dict[str, Any] = {"model": model, "image": image}
        if model in table_models:
            body["table_bboxes"] = [[0, 0, 256, 128]]
        return http.post("/v1/parse", json=body)

    def chat_call(http: httpx.Client, model: str) -> httpx.Response:
        body = {"model": model, "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 4}
        return http.post("/v1/chat/completions", json=body)

    def speech_call(http: httpx.Client, model: str) -> httpx.Response:
        resp = http.post("/v1/audio/speech", json={"model": model, "input": "Hello there."})
        if resp.status_code == 200:
            speech["wav"] = resp.content
        return resp

    def transcription_call(http: httpx.Client, model: str) -> httpx.Response:
        files = {"file": ("hello.wav", speech.get("wav", b""), "audio/wav")}
        return http.post("/v1/audio/transcriptions", data={"model": model}, files=files)

    return {
        "chat": chat_call,
        "pooling": lambda http, m: http.post("/v1/embeddings", json={"model": m, "input": "hi"}),
        "speech": speech_call,
        "transcription": transcription_call,
        "detect": lambda http, m: http.post("/v1/detect", json={"model": m, "image": image}),
        "parse": parse_call,
        "video": lambda http, m: http.post(
            "/v1/video/generations", json={"model": m, "prompt": "a red ball", "fps": 8}
        ),
    }


def call_until_answered(http: httpx.Client, call: Call, model: str, deadline_s: float) -> Any:
    """(status, 503 model_warming count, seconds); waits out 503s by their Retry-After."""
    started, warming = time.monotonic(), 0
    while time.monotonic() - started < deadline_s:
        resp = call(http, model)
        if resp.status_code != 503:
            return resp.status_code, warming, time.monotonic() - started
        warming += 1
        # As a careful client: wait what the gateway says (the issue's "at most one 503 per
        # wake" is about that wait being right), not a fixed poll.
        time.sleep(min(float(resp.headers.get("retry-after", "5")), RETRY_AFTER_CAP_S))
    return 503, warming, time.monotonic() - started


def catalog_heads(config: str) -> list[tuple[str, str]]:
    """(model id, head kind) of every catalog head of CONFIG, in catalog order."""
    from serve_app.cli.serve import _catalog_models, load_serve_config

    models = _catalog_models(load_serve_config(config))
    return [(m.id, m.head) for m in models if not m.is_external and m.head_id == m.id]


def table_structure_models(config: str) -> set[str]:
    """Parse models of CONFIG that need ``table_bboxes`` (the documents service's rule)."""
    from serve_app.cli.serve import _catalog_models, load_serve_config
    from serve_app.inference.documents.service import TABLE_STRUCTURE

    models = _catalog_models(load_serve_config(config))
    return {m.id for m in models if m.head == "parse" and TABLE_STRUCTURE in m.specialties}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", default="configs/local.yaml")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--deadline-s", type=float, default=900.0, help="per call")
    args = parser.parse_args()

    state = Path(tempfile.mkdtemp(prefix="every-route-"))
    wall_start = time.time()
    proc, base = start_gateway_run(args.config, state)
    sampler = Sampler(proc.pid, period_s=2.0)
    sampler.start()
    failures = calls_made = 0
    try:
        wait_ready(proc, state / "gateway-run.log", args.deadline_s)
        key = mint_key(f"sqlite:///{state / 'gateway.db'}")
        chat(base, key, FIRST_MODEL, args.deadline_s)
        routes = calls({}, table_structure_models(args.config))
        headers = {"Authorization": f"Bearer {key}"}
        with httpx.Client(base_url=base, headers=headers, timeout=600) as http:
            try:
                for round_ in range(1, args.rounds + 1):
                    for model, head in catalog_heads(args.config):
                        status, warming, took = call_until_answered(
                            http, routes[head], model, args.deadline_s
                        )
                        failures += status not in (200, 202)
                        calls_made += 1
                        stack = sum(sampler.snapshot().values()) / GiB
                        print(
                            f"round {round_} {head:<13} {model:<34} {status} after {warming} "
                            f"x 503 in {took:6.1f} s; stack {stack:5.2f} GiB; machine used "
                            f"{machine_used() / GiB:5.2f} GiB",
                            flush=True,
                        )
            except KeyboardInterrupt:  # cut short (a time limit): the figures so far still count
                # `timeout -s INT` signals the process and its group: a second SIGINT would
                # cut the summary below off too.
                signal.signal(signal.SIGINT, signal.SIG_IGN)
                print(f"cut short after {calls_made} calls", flush=True)
        print(
            f"peak: stack {sampler.peak_stack / GiB:.2f} GiB PSS, machine used "
            f"{sampler.peak_used / GiB:.2f} GiB; Ray OOM kills: {oom_kills(wall_start)}; "
            f"calls not answered: {failures} of {calls_made}; "
            f"{(time.time() - wall_start) / 60:.1f} min"
        )
        print(f"at the stack's peak ({sampler.peak_at:.0f} s after launch):")
        print(table(sampler.peak_groups), flush=True)
        print(f"gateway run log: {state / 'gateway-run.log'}")
    finally:
        sampler.stop()
        stop_gateway_run(proc)
    return 1 if failures else 0


if __name__ == "__main__":
    raise SystemExit(main())
