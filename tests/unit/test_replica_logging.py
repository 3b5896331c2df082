"""Replica logging: our module loggers reach the replica's stderr once, at the chosen level."""

from __future__ import annotations

import logging
from collections.abc import Iterator

import pytest

from deployments.replica_logging import OUR_LOGGERS, configure_replica_logging


@pytest.fixture
def clean_loggers() -> Iterator[None]:
    saved = {n: (logging.getLogger(n).handlers[:], logging.getLogger(n).level) for n in OUR_LOGGERS}
    yield
    for name, (handlers, level) in saved.items():
        logger = logging.getLogger(name)
        logger.handlers[:] = handlers
        logger.setLevel(level)
        logger.propagate = True


def test_info_records_of_heads_reach_stderr_once(
    clean_loggers: None, capsys: pytest.CaptureFixture[str]
) -> None:
    configure_replica_logging()
    configure_replica_logging()  # a second deployment in the same worker
    logging.getLogger("deployments.engines.vllm_engine").info("engine up in %.1f s", 12.0)
    err = capsys.readouterr().err
    assert err.count("deployments.engines.vllm_engine: engine up in 12.0 s") == 1


def test_the_level_comes_from_the_environment(
    clean_loggers: None, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("GATEWAY_LOG_LEVEL", "warning")
    configure_replica_logging()
    logging.getLogger("serve_app.x").info("quiet")
    logging.getLogger("serve_app.x").warning("loud")
    err = capsys.readouterr().err
    assert "quiet" not in err and "loud" in err
