"""The database path of the accounts generation: read in the background while busy.

A request must not wait for the database read (issue 14), yet a change made by
another process without Redis must still be seen within 100 ms, and an idle
replica must stop reading.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from serve_app.auth.epoch import EpochReader, EpochWatch, bump_in_transaction
from serve_app.storage.db import Database
from tests.fixtures.limits import ManualClock
from tests.fixtures.waiting import until


def _database(tmp_path: Path) -> Database:
    database = Database(f"sqlite:///{tmp_path / 'epoch.db'}")
    database.migrate()
    return database


def _bump_from_elsewhere(tmp_path: Path) -> None:
    """Another process's write: a separate engine, nothing told in this one."""
    other = Database(f"sqlite:///{tmp_path / 'epoch.db'}")
    with other.engine.begin() as conn:
        bump_in_transaction(conn)
    other.engine.dispose()


class _InlineCount:
    """Counts the reads a request waited for (``_claim_inline`` said yes)."""

    def __init__(self, watch: EpochWatch) -> None:
        self.count = 0
        claim = watch._claim_inline

        def counting() -> bool:
            claimed = claim()
            self.count += claimed
            return claimed

        watch._claim_inline = counting  # type: ignore[method-assign]


async def test_busy_requests_do_not_wait_for_the_database(tmp_path: Path) -> None:
    """While the poller reads every interval, only the very first request reads itself.

    The clock is the test's: each interval the poller is made to read (as its timer
    would), then requests come at every 10 ms up to just before the value counts as
    stale (two intervals). A rule that read per request once the value is one interval
    old would read five times a round; requests that read for themselves instead of a
    poller would never see the poller's read arrive (the hang guard). A busy machine
    that delays a real timer cannot change what is counted.
    """
    clock = ManualClock(1000.0)
    watch = EpochWatch(_database(tmp_path), poll_s=0.05, clock=clock)
    inline = _InlineCount(watch)
    try:
        await watch.current()  # before the poller ever read: this one reads inline
        for _ in range(8):  # eight poll intervals of traffic
            clock.advance(0.05)
            watch._poller.wake()  # its timer would also do (a wake during a read is lost)
            await until(lambda: watch._db_read_at >= clock.now)  # a read begun by now
            for _ in range(10):
                await watch.current()
                clock.advance(0.009)
        assert inline.count == 1
    finally:
        await watch.aclose()


async def test_a_change_elsewhere_is_seen_within_100_ms(tmp_path: Path) -> None:
    watch = EpochWatch(_database(tmp_path))
    try:
        before = await watch.current()
        await asyncio.to_thread(_bump_from_elsewhere, tmp_path)
        await asyncio.sleep(0.1)
        after = await watch.current()
        assert after[2] == before[2] + 1
    finally:
        await watch.aclose()


async def test_the_poller_stops_when_idle_and_the_next_request_reads_inline(
    tmp_path: Path,
) -> None:
    clock = ManualClock(1000.0)
    watch = EpochWatch(_database(tmp_path), poll_s=0.02, idle_s=0.1, clock=clock)
    inline = _InlineCount(watch)
    try:
        first = await watch.current()
        assert watch._poller.running
        clock.advance(0.1)  # no request for idle_s: the poller's next round is its last
        await until(lambda: not watch._poller.running)
        clock.advance(1.0)  # idle on: the last value read ages past two intervals
        await asyncio.to_thread(_bump_from_elsewhere, tmp_path)
        # Idle: nothing read the change, so this request must, and must see it.
        assert (await watch.current())[2] == first[2] + 1
        assert inline.count == 2
    finally:
        await watch.aclose()


async def test_aclose_stops_the_poller(tmp_path: Path) -> None:
    watch = EpochWatch(_database(tmp_path), poll_s=0.02)
    await watch.current()
    assert watch._poller.running
    await watch.aclose()
    assert not watch._poller.running


def test_kept_connection_sees_each_commit_of_another_process(tmp_path: Path) -> None:
    """The reader keeps one connection: each read must end its transaction, or SQLite
    (WAL) would keep answering from the snapshot of the first read."""
    reader = EpochReader(_database(tmp_path))
    try:
        first = reader.read()
        for bump in range(1, 4):
            _bump_from_elsewhere(tmp_path)
            assert reader.read() == first + bump
    finally:
        reader.close()


def test_failed_read_drops_the_connection_and_the_next_read_recovers(tmp_path: Path) -> None:
    reader = EpochReader(_database(tmp_path))
    try:
        before = reader.read()
        kept = reader._conn
        assert kept is not None
        kept.close()  # a connection that broke under the reader (a restarted server)
        with pytest.raises(Exception):  # noqa: B017  # whatever the driver raises
            reader.read()
        assert reader._conn is None
        _bump_from_elsewhere(tmp_path)
        assert reader.read() == before + 1  # a fresh connection from the pool
    finally:
        reader.close()


def test_kept_connection_serves_reads_from_any_worker_thread(tmp_path: Path) -> None:
    """The poller reads through ``asyncio.to_thread``: each read may come from another
    thread than the one that opened the connection (SQLite refuses that by default)."""
    from concurrent.futures import ThreadPoolExecutor

    reader = EpochReader(_database(tmp_path))
    try:
        with ThreadPoolExecutor(max_workers=4) as pool:
            values = list(pool.map(lambda _: reader.read(), range(16)))
        assert len(set(values)) == 1
    finally:
        reader.close()
