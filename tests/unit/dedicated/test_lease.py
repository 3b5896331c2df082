"""The named DB lease as an object: one holder at a time across gateway replicas."""

from __future__ import annotations

from pathlib import Path

from serve_app.dedicated.lease import StoreLease
from serve_app.dedicated.store import DedicatedStore
from serve_app.storage.db import Database


def test_one_holder_at_a_time_and_release_hands_it_over(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'lease.db'}"
    Database(url).migrate()
    mine = StoreLease(DedicatedStore(Database(url)), "head-memory-budget")
    theirs = StoreLease(DedicatedStore(Database(url)), "head-memory-budget")
    other_name = StoreLease(DedicatedStore(Database(url)), "dedicated-reconciler")
    assert mine.acquire()
    assert mine.acquire()  # renewing
    assert not theirs.acquire()
    assert other_name.acquire()  # another lease name is another row
    theirs.release()  # not the holder: changes nothing
    assert not theirs.acquire()
    mine.release()
    assert theirs.acquire()
    assert not mine.acquire()


def test_an_expired_lease_is_taken_over(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'lease.db'}"
    Database(url).migrate()
    dead = StoreLease(DedicatedStore(Database(url)), "head-memory-budget", ttl_s=-1)
    assert dead.acquire()  # a holder that died: its row already expired
    assert StoreLease(DedicatedStore(Database(url)), "head-memory-budget").acquire()
