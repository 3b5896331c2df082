"""A pooled Redis connection that died (Redis restarted, failed over, or closed it) costs no
request: the command is sent once more on a new connection (``shared_redis``).

Without the retry the first admission on each such connection failed, which with limits
failing closed was a 503 right after Redis came back (tests/faults/test_redis_outage.py).
"""

from __future__ import annotations

import redis

from serve_app.limits.buckets import BucketSpec, Ticket
from serve_app.requests.replays import Claimed, RedisReplayStore
from tests.fixtures.limits import StoreFactory


def _kill(url: str, client_id: int) -> None:
    admin = redis.Redis.from_url(url)
    try:
        assert admin.client_kill_filter(_id=str(client_id)) == 1
    finally:
        admin.close()


async def test_a_killed_pooled_connection_is_replaced_not_an_error(
    make_redis_store: StoreFactory, redis_url: str
) -> None:
    store = make_redis_store()
    bucket = BucketSpec("requests", "{u:u1}:rpm:user", 10, "user")
    assert isinstance(await store.admit("r1", [bucket], 0), Ticket)
    # The pool holds one idle connection now: find its id and have the server drop it.
    _kill(redis_url, await store._redis.client_id())  # type: ignore[attr-defined]
    assert isinstance(await store.admit("r2", [bucket], 0), Ticket)


async def test_the_replay_store_survives_it_too(redis_url: str, redis_prefix: str) -> None:
    store = RedisReplayStore.from_url(redis_url, prefix=redis_prefix)
    try:
        assert isinstance(await store.claim("slot-1", "fp", 5.0), Claimed)
        _kill(redis_url, await store._redis.client_id())
        assert isinstance(await store.claim("slot-2", "fp", 5.0), Claimed)
    finally:
        await store.aclose()


async def test_a_claim_sent_twice_is_still_the_senders(redis_url: str, redis_prefix: str) -> None:
    """The retry after a connection broke behind an executed claim: same token, same slot."""
    store = RedisReplayStore.from_url(redis_url, prefix=redis_prefix)
    try:
        args = ["fp", "token-1", 5000]
        first = await store._claim(keys=store._key("slot-3"), args=args)
        again = await store._claim(keys=store._key("slot-3"), args=args)
        other = await store._claim(keys=store._key("slot-3"), args=["fp", "token-2", 5000])
        assert [r[0] for r in (first, again, other)] == [b"claimed", b"claimed", b"pending"]
    finally:
        await store.aclose()
