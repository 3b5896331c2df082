"""Gateway metrics: requests, tokens, 429s and latency per model.

Inside Ray (a Serve replica) the metrics are ``ray.serve.metrics`` objects:
Ray exports them to Prometheus with the replica's deployment/application tags
and the dashboard's metrics view shows them (names get Ray's ``ray_`` prefix).
Outside Ray (unit tests, tools) they go to ``prometheus_client`` when it is
installed, else nowhere. Choosing the backend never initialises Ray.
"""

from __future__ import annotations

import logging
import threading
from typing import Any, Protocol

logger = logging.getLogger(__name__)

LATENCY_BUCKETS_S = [0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300]

_TAGS: dict[str, tuple[str, ...]] = {
    "gateway_requests": ("model", "endpoint", "outcome"),
    "gateway_tokens": ("model", "kind"),
    "gateway_rate_limited": ("model", "code"),
    "gateway_request_latency_seconds": ("model", "endpoint"),
    "gateway_limits_fail_open": ("phase",),
    "gateway_head_evictions": ("model", "for_model"),
}
_DESCRIPTIONS = {
    "gateway_requests": "Inference requests by outcome (ok, partial, aborted, rejected, error).",
    "gateway_tokens": "Tokens metered (kind: prompt or completion).",
    "gateway_rate_limited": "Requests refused with 429, by error code.",
    "gateway_request_latency_seconds": "Seconds from request start to the last byte of the answer.",
    "gateway_limits_fail_open": "Requests admitted without rate limits because the counter "
    "store was unreachable (limits.fail_open); alert on any increase.",
    "gateway_head_evictions": "Heads put to sleep to make room under the memory budget "
    "(model: the head put to sleep; for_model: the head woken).",
}
_HISTOGRAMS = frozenset({"gateway_request_latency_seconds"})
"""Observed values (``observe``); every other metric is a counter (``inc``)."""


class MetricsBackend(Protocol):
    def inc(self, name: str, value: float, tags: dict[str, str]) -> None: ...

    def observe(self, name: str, value: float, tags: dict[str, str]) -> None: ...


class NoopBackend:
    def inc(self, name: str, value: float, tags: dict[str, str]) -> None:
        return None

    def observe(self, name: str, value: float, tags: dict[str, str]) -> None:
        return None


class RayBackend:
    """``ray.serve.metrics`` counters and histograms (created once per process)."""

    def __init__(self) -> None:
        from ray.serve import metrics

        serve_metrics: Any = metrics  # its stubs type tag_keys as a 1-tuple
        self._metrics: dict[str, Any] = {}
        for name, tags in _TAGS.items():
            if name in _HISTOGRAMS:
                self._metrics[name] = serve_metrics.Histogram(
                    name, _DESCRIPTIONS[name], boundaries=LATENCY_BUCKETS_S, tag_keys=tags
                )
            else:
                self._metrics[name] = serve_metrics.Counter(
                    name, _DESCRIPTIONS[name], tag_keys=tags
                )

    def inc(self, name: str, value: float, tags: dict[str, str]) -> None:
        self._metrics[name].inc(value, tags=tags)

    def observe(self, name: str, value: float, tags: dict[str, str]) -> None:
        self._metrics[name].observe(value, tags=tags)


class PrometheusBackend:
    """``prometheus_client`` collectors on ``registry`` (default: the global one)."""

    def __init__(self, registry: Any = None) -> None:
        import prometheus_client as prom

        registry = prom.REGISTRY if registry is None else registry
        self._metrics: dict[str, Any] = {}
        for name, tags in _TAGS.items():
            if name in _HISTOGRAMS:
                self._metrics[name] = prom.Histogram(
                    name,
                    _DESCRIPTIONS[name],
                    tags,
                    buckets=LATENCY_BUCKETS_S,
                    registry=registry,
                )
            else:
                self._metrics[name] = prom.Counter(
                    name, _DESCRIPTIONS[name], tags, registry=registry
                )

    def inc(self, name: str, value: float, tags: dict[str, str]) -> None:
        self._metrics[name].labels(**tags).inc(value)

    def observe(self, name: str, value: float, tags: dict[str, str]) -> None:
        self._metrics[name].labels(**tags).observe(value)


_default: MetricsBackend | None = None
_default_lock = threading.Lock()


def _ray_running() -> bool:
    try:
        import ray
    except ImportError:
        return False
    return bool(ray.is_initialized())


def default_backend() -> MetricsBackend:
    """One backend per process: metric names can be registered only once."""
    global _default
    with _default_lock:
        if _default is None:
            _default = _select_backend()
        return _default


def _select_backend() -> MetricsBackend:
    if _ray_running():
        try:
            return RayBackend()
        except Exception:
            logger.warning("Ray metrics unavailable; falling back", exc_info=True)
    try:
        return PrometheusBackend()
    except ImportError:
        return NoopBackend()


class GatewayMetrics:
    """What the request path reports; a backend error never fails a request."""

    def __init__(self, backend: MetricsBackend | None = None) -> None:
        self._backend = backend

    @property
    def backend(self) -> MetricsBackend:
        if self._backend is None:
            self._backend = default_backend()
        return self._backend

    def _safely(self, kind: str, name: str, value: float, tags: dict[str, str]) -> None:
        try:
            if kind == "inc":
                self.backend.inc(name, value, tags)
            else:
                self.backend.observe(name, value, tags)
        except Exception:
            logger.debug("metric %s not recorded", name, exc_info=True)

    def request(self, model: str, endpoint: str, outcome: str) -> None:
        self._safely("inc", "gateway_requests", 1, _tags(model, endpoint, outcome=outcome))

    def tokens(self, model: str, prompt: int, completion: int) -> None:
        for kind, count in (("prompt", prompt), ("completion", completion)):
            if count:
                self._safely("inc", "gateway_tokens", count, {"model": model, "kind": kind})

    def rate_limited(self, model: str, code: str) -> None:
        self._safely("inc", "gateway_rate_limited", 1, {"model": model, "code": code})

    def limits_fail_open(self) -> None:
        """A request went through unlimited because the counter store failed (fail_open)."""
        self._safely("inc", "gateway_limits_fail_open", 1, {"phase": "admit"})

    def eviction(self, model: str, for_model: str) -> None:
        """``model``'s head was put to sleep to make room for ``for_model``'s."""
        self._safely("inc", "gateway_head_evictions", 1, {"model": model, "for_model": for_model})

    def latency(self, model: str, endpoint: str, seconds: float) -> None:
        self._safely("observe", "gateway_request_latency_seconds", seconds, _tags(model, endpoint))


def _tags(model: str, endpoint: str, **extra: str) -> dict[str, str]:
    return {"model": model, "endpoint": endpoint, **extra}
