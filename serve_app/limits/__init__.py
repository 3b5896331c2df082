"""Rate limits and daily quotas with counters shared by gateway replicas (no Ray here)."""

from serve_app.limits.buckets import BucketSpec, CounterStore, Denial, Ticket
from serve_app.limits.limiter import (
    PlatformLimits,
    RateLimiter,
    build_counter_store,
    plan_buckets,
    rate_limit_error,
)
from serve_app.limits.memory import InProcessCounterStore
from serve_app.limits.redis_store import RedisCounterStore

__all__ = [
    "BucketSpec",
    "CounterStore",
    "Denial",
    "InProcessCounterStore",
    "PlatformLimits",
    "RateLimiter",
    "RedisCounterStore",
    "Ticket",
    "build_counter_store",
    "plan_buckets",
    "rate_limit_error",
]
