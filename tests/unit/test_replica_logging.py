"""Replica logging: our module loggers reach the replica's stderr once, at the chosen level."""

from __future__ import annotations

import io
import logging
import logging.handlers
from collections.abc import Iterator
from pathlib import Path

import pytest

from deployments.replica_logging import (
    ENGINE_LOGGERS,
    OUR_LOGGERS,
    SERVE_LOGGER,
    configure_replica_logging,
)


@pytest.fixture
def clean_loggers() -> Iterator[None]:
    names = (*OUR_LOGGERS, *ENGINE_LOGGERS)
    saved = {n: (logging.getLogger(n).handlers[:], logging.getLogger(n).level) for n in names}
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
    logging.getLogger("deployments.chat.vllm_engine").info("engine up in %.1f s", 12.0)
    err = capsys.readouterr().err
    assert err.count("deployments.chat.vllm_engine: engine up in 12.0 s") == 1


def test_the_level_comes_from_the_environment(
    clean_loggers: None, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("GATEWAY_LOG_LEVEL", "warning")
    configure_replica_logging()
    logging.getLogger("serve_app.x").info("quiet")
    logging.getLogger("serve_app.x").warning("loud")
    err = capsys.readouterr().err
    assert "quiet" not in err and "loud" in err


def test_in_a_serve_replica_records_reach_the_replica_log_file(
    clean_loggers: None,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Serve's replica logger is a MemoryHandler over the log file the dashboard shows."""
    monkeypatch.setenv("VLLM_LOGGING_LEVEL", "INFO")  # the engine tests' conftest sets ERROR
    serve_logger = logging.getLogger(SERVE_LOGGER)
    saved = serve_logger.handlers[:]
    log_file = tmp_path / "replica_gateway_chat-x_abc.log"
    file_handler = logging.FileHandler(log_file)
    serve_logger.handlers[:] = [logging.handlers.MemoryHandler(1, target=file_handler)]
    try:
        configure_replica_logging()
        logging.getLogger("deployments.chat.head").info("head ready")
        # A child made now: vLLM's own dictConfig, run by an earlier test of the session,
        # disabled the vLLM loggers that existed then (disable_existing_loggers).
        logging.getLogger("vllm.replica_logging_probe").info("engine up")
        file_handler.flush()
    finally:
        serve_logger.handlers[:] = saved
        for name in ENGINE_LOGGERS:
            logging.getLogger(name).handlers[:] = []
            logging.getLogger(name).propagate = True
    text = log_file.read_text()
    assert "head ready" in text and "engine up" in text
    assert "head ready" not in capsys.readouterr().err


@pytest.fixture
def serve_handlers(tmp_path: Path) -> Iterator[tuple[io.StringIO, Path, logging.Handler]]:
    """Serve's replica logger as Serve sets it up: stderr stream, buffered file."""
    serve_logger = logging.getLogger(SERVE_LOGGER)
    saved, saved_level = serve_logger.handlers[:], serve_logger.level
    console = io.StringIO()
    stream = logging.StreamHandler(console)
    log_file = tmp_path / "replica_gateway_pooling-x_abc.log"
    file_handler = logging.FileHandler(log_file)
    serve_logger.handlers[:] = [stream, logging.handlers.MemoryHandler(1, target=file_handler)]
    serve_logger.setLevel(logging.INFO)
    try:
        yield console, log_file, file_handler
    finally:
        serve_logger.handlers[:] = saved
        serve_logger.setLevel(saved_level)
        file_handler.close()


def _serve_lines(file_handler: logging.Handler) -> None:
    serve_logger = logging.getLogger(SERVE_LOGGER)
    serve_logger.info("CALL embed OK 98.1ms", extra={"serve_access_log": True})
    serve_logger.info("replica ready")
    file_handler.flush()


def test_access_lines_stay_off_the_console_but_in_the_file(
    clean_loggers: None,
    serve_handlers: tuple[io.StringIO, Path, logging.Handler],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv("GATEWAY_CONSOLE_ACCESS_LOG", raising=False)
    console, log_file, file_handler = serve_handlers
    configure_replica_logging()
    configure_replica_logging()  # a second deployment in the same worker: one filter
    stream = logging.getLogger(SERVE_LOGGER).handlers[0]
    assert len(stream.filters) == 1
    _serve_lines(file_handler)
    assert "replica ready" in console.getvalue()
    assert "CALL embed" not in console.getvalue()
    text = log_file.read_text()
    assert "CALL embed OK 98.1ms" in text and "replica ready" in text


def test_the_console_keeps_access_lines_when_asked(
    clean_loggers: None,
    serve_handlers: tuple[io.StringIO, Path, logging.Handler],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("GATEWAY_CONSOLE_ACCESS_LOG", "1")
    console, _log_file, file_handler = serve_handlers
    configure_replica_logging()
    _serve_lines(file_handler)
    assert "CALL embed OK 98.1ms" in console.getvalue()
