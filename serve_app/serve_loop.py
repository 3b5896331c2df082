"""Which replicas run their code on Ray Serve's own event loop (issue 14).

By default Ray Serve runs a replica's user code on a second event loop in a
thread of its own (``RAY_SERVE_RUN_USER_CODE_IN_SEPARATE_THREAD``), so that
blocking user code cannot stall the replica's own work (health checks, metrics,
the direct-ingress HTTP server). The price is a thread crossing, with a wake-up
on the other side, for every request and every ASGI message or streamed item.
Timestamps taken in every process on one request's way (bench/RESULTS.md,
2026-11-26) put that at ~2.5 ms of time to first token through the gateway
replica and a chat head: client -> gateway ASGI 2.8 -> 2.0 ms, gateway -> head
3.0 -> 2.6 ms, first token head -> gateway 1.6 -> 1.0 ms, gateway -> client
1.7 -> 1.0 ms.

The gateway replica and the chat heads are async throughout (database reads,
engine start and model preparation go to threads; vLLM's engine runs in its own
process), so they run on Serve's loop. The speech, transcription, document and
video heads call torch in-process and keep Serve's default. An operator who
wants the default back for a deployment sets the variable in that
deployment's ``ray_actor_options.runtime_env.env_vars``; an explicit value wins.
"""

from __future__ import annotations

from typing import Any

USER_CODE_THREAD_ENV = "RAY_SERVE_RUN_USER_CODE_IN_SEPARATE_THREAD"


def on_serve_loop(actor_options: dict[str, Any]) -> dict[str, Any]:
    """``actor_options`` with the replica's user code on Serve's loop, unless set already."""
    options = dict(actor_options)
    runtime_env = dict(options.get("runtime_env") or {})
    env_vars = dict(runtime_env.get("env_vars") or {})
    env_vars.setdefault(USER_CODE_THREAD_ENV, "0")
    runtime_env["env_vars"] = env_vars
    options["runtime_env"] = runtime_env
    return options
