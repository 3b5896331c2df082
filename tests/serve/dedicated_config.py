"""The dedicated-endpoint part of the session's Serve stack (tests/serve/conftest.py).

A cheap scripted model for dedicated endpoints (a tenth of a CPU per replica),
a CPU card on the rate card, short reconcile periods, no redeploy cooldown, and
one constructor attempt per replica so a failed boot is declared quickly.
"""

from __future__ import annotations

from typing import Any

DEDICATED_MODEL = "scripted-dedicated"
DEDICATED_POOLING_MODEL = "scripted-dedicated-embed"
"""An embedding model for dedicated endpoints: the scripted pooling engine (64-dim vectors
known from the text) in the real pooling head (tests/serve/test_dedicated_pooling_e2e.py)."""

CAPACITY_RESOURCES = {"capacity_reserved": 1.0, "capacity_spot": 1.0}
"""Both capacity classes declared on the single local node."""


def dedicated_catalog() -> list[dict[str, Any]]:
    return [
        {
            "id": DEDICATED_MODEL,
            "head": "chat",
            "context_length": 2048,
            "max_output_tokens": 16,
            "engine": {
                "backend": "tests.fakes.boot_engine:BootCheckedEngine",
                "config": {
                    "max_model_len": 2048,
                    "max_num_seqs": 4,
                    "fail_start_with": {"max_num_seqs": 3},
                },
            },
            "deployment": {
                "max_ongoing_requests": 8,
                "ray_actor_options": {"num_cpus": 0.1},
                "health_check_period_s": 2,
            },
        },
        {
            "id": DEDICATED_POOLING_MODEL,
            "head": "pooling",
            "output_modalities": ["embedding", "score"],
            "context_length": 32,
            "pooling": {"dimensions": 64, "score": "bi-encoder"},
            "engine": {
                "backend": "tests.fakes.scripted_pooling:ScriptedPoolingEngine",
                "config": {},
            },
            "deployment": {
                "max_ongoing_requests": 8,
                "ray_actor_options": {"num_cpus": 0.1},
                "health_check_period_s": 2,
            },
        },
    ]


DEDICATED_ARGS: dict[str, Any] = {
    "rate_card": {
        "applies_to_gpu_type": "cpu",
        "hourly_by_gpu_type": {"cpu": {"reserved": 0.12, "spot": 0.06}},
    },
    "default_gpu_type": "cpu",
    "models": {DEDICATED_MODEL: {"offered_settings": ["max_num_seqs"]}},
    "cooldown_s": 0,
    "reconcile_interval_s": 0.5,
    "refresh_s": 0.5,
    "max_constructor_retry_count": 1,
    "warming_retry_after_s": 1,
}
