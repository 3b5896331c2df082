"""Deleting an adapter unloads it on every replica (docs/reference/adapters.md#deleting).

The gateway's loop (``RayHeadClient.forget_adapter``) against a fake handle whose
router, like Serve's, sends a ``multiplexed_model_id`` call to a replica it believes
holds the id (its view lagging the replicas'), else to one with the fewest models; the
replica side (``drop_multiplexed``, ``AdapterSlots.forget``, ``ChatHead.forget_adapter``)
against a fake of Serve's multiplexing wrapper, and a pin on the installed Ray's.
"""

from __future__ import annotations

import asyncio
import inspect
import logging
from collections import OrderedDict
from collections.abc import Callable
from pathlib import Path
from types import SimpleNamespace
from typing import Any, ClassVar

import pytest
import ray.serve.api
import ray.serve.multiplex

from deployments.chat.adapters import (
    MULTIPLEX_WRAPPER_ATTR,
    AdapterFiles,
    AdapterSlots,
    MultiplexedAdapter,
    drop_multiplexed,
)
from deployments.chat.head import ChatHead, ChatHeadCore
from serve_app.contract.adapters import AdapterRef
from serve_app.heads.client import FORGET_QUIET_CALLS, RayHeadClient
from serve_app.protocol.errors import NotFoundError

KEY = "ad_1"


# ---- the gateway's loop -----------------------------------------------------------------
class _Reply:
    def __init__(self, value: Any) -> None:
        self.value = value

    def __await__(self):  # type: ignore[no-untyped-def]
        yield from asyncio.sleep(0).__await__()
        return self.value

    def cancel(self) -> None:
        pass


class _Replica:
    def __init__(self, held: set[str]) -> None:
        self.held = set(held)
        self.forgotten: set[str] = set()

    def forget(self, key: str) -> str:
        if key in self.forgotten:
            return "forgotten"
        self.forgotten.add(key)
        if key in self.held:
            self.held.discard(key)
            return "unloaded"
        return "absent"


class _Handle:
    """Replicas behind a router whose view of who holds what trails by ``lag`` calls."""

    def __init__(self, replicas: list[_Replica], lag: int = 0) -> None:
        self.replicas = replicas
        self.lag = lag
        self.views: list[list[set[str]]] = []
        self.calls: list[int] = []
        self._key: str | None = None

    def view(self) -> list[set[str]]:
        now = [set(r.held) for r in self.replicas]
        self.views.append(now)
        return self.views[max(0, len(self.views) - 1 - self.lag)]

    def options(self, multiplexed_model_id: str) -> _Handle:
        self._key = multiplexed_model_id
        return self

    @property
    def forget_adapter(self) -> _Handle:
        return self

    def remote(self, key: str) -> _Reply:
        assert key == self._key
        view = self.view()
        holders = [i for i, held in enumerate(view) if key in held]
        chosen = holders[0] if holders else min(range(len(view)), key=lambda i: len(view[i]))
        self.calls.append(chosen)
        return _Reply(self.replicas[chosen].forget(key))


def _client(handle: Any) -> RayHeadClient:
    client = RayHeadClient("base", handle)
    client.forget_settle_s = 0
    return client


async def test_every_replica_holding_the_adapter_unloads_it() -> None:
    replicas = [_Replica({KEY, "x"}), _Replica({"x"}), _Replica({KEY}), _Replica({KEY, "y"})]
    handle = _Handle(replicas, lag=1)
    assert await _client(handle).forget_adapter(KEY)
    assert all(KEY not in r.held for r in replicas)
    # Each holder: its call, and one more while the router's view still lists it.
    assert len(handle.calls) <= 2 * 3 + FORGET_QUIET_CALLS


async def test_nobody_holding_it_costs_one_call() -> None:
    handle = _Handle([_Replica({"x"}), _Replica(set())])
    assert not await _client(handle).forget_adapter(KEY)
    assert handle.calls == [1]


async def test_a_fallback_picking_the_replica_that_dropped_it_ends_the_loop() -> None:
    """After the only holder dropped it, it has the fewest models: the fallback picks it
    again and again; ``FORGET_QUIET_CALLS`` such answers end the loop."""
    handle = _Handle([_Replica({KEY}), _Replica({"x", "y"})])
    assert await _client(handle).forget_adapter(KEY)
    assert handle.calls == [0] * (1 + FORGET_QUIET_CALLS)


async def test_the_loop_is_bounded_and_says_so(caplog: pytest.LogCaptureFixture) -> None:
    class Always(_Handle):
        def remote(self, key: str) -> _Reply:
            self.calls.append(0)
            return _Reply("unloaded")

    handle = Always([])
    client = _client(handle)
    client.forget_max_calls = 5
    with caplog.at_level(logging.WARNING):
        assert await client.forget_adapter(KEY)
    assert len(handle.calls) == 5 and "may still be held" in caplog.text


async def test_a_head_answering_a_bool_still_ends_the_loop() -> None:
    class Old(_Handle):
        def remote(self, key: str) -> _Reply:
            self.calls.append(0)
            return _Reply(len(self.calls) == 1)

    handle = Old([])
    assert await _client(handle).forget_adapter(KEY)
    assert len(handle.calls) == 2


# ---- the replica ------------------------------------------------------------------------
class _Engine:
    def __init__(self) -> None:
        self.log: list[tuple[str, str]] = []

    async def load_adapter(self, model_id: str, path: str) -> None:
        self.log.append(("load", model_id))

    async def unload_adapter(self, model_id: str) -> None:
        self.log.append(("unload", model_id))


class _Wrapper:
    """The parts of Ray's ``_ModelMultiplexWrapper`` ``drop_multiplexed`` uses."""

    def __init__(self, models: dict[str, Any]) -> None:
        self.models: OrderedDict[str, Any] = OrderedDict(models)
        self._model_cache_lock = asyncio.Lock()
        self._push_multiplexed_replica_info = False


def _owner(wrapper: object | None) -> Callable[[str], Any]:
    async def load_adapter(key: str) -> Any:
        return key

    if wrapper is not None:
        setattr(load_adapter, MULTIPLEX_WRAPPER_ATTR, wrapper)
    return load_adapter


def _ref(tmp_path: Path, key: str = KEY, name: str = "a") -> AdapterRef:
    return AdapterRef(key=key, model_id=f"base:{name}", path=str(tmp_path))


async def test_drop_takes_the_key_out_of_serves_lru_and_pushes(tmp_path: Path) -> None:
    slots = AdapterSlots(_Engine(), AdapterFiles(None, tmp_path))
    model = MultiplexedAdapter(slots, KEY, asyncio.get_running_loop())
    wrapper = _Wrapper({"other": object(), KEY: model})
    assert await drop_multiplexed(_owner(wrapper), KEY)
    assert list(wrapper.models) == ["other"] and wrapper._push_multiplexed_replica_info
    model.__del__()  # disarmed: the garbage collector evicts nothing later
    await asyncio.sleep(0)
    assert not await drop_multiplexed(_owner(wrapper), KEY)
    assert not await drop_multiplexed(_owner(None), KEY)  # nothing loaded yet


async def test_a_changed_wrapper_is_left_alone_and_logged(
    caplog: pytest.LogCaptureFixture,
) -> None:
    class Changed:
        models: ClassVar[dict[str, Any]] = {KEY: object()}

    with caplog.at_level(logging.WARNING):
        assert not await drop_multiplexed(_owner(Changed()), KEY)
    assert KEY in Changed.models and "changed" in caplog.text


def test_the_installed_ray_keeps_what_drop_multiplexed_reads() -> None:
    wrapper = inspect.getsource(ray.serve.multiplex._ModelMultiplexWrapper)
    for name in (
        "self.models = OrderedDict()",
        "self._model_cache_lock = asyncio.Lock()",
        "self._push_multiplexed_replica_info = True",
    ):
        assert name in wrapper
    assert f'"{MULTIPLEX_WRAPPER_ATTR}"' in inspect.getsource(ray.serve.api.multiplexed)


async def test_slots_forget_answers_and_never_load_it_again(tmp_path: Path) -> None:
    engine = _Engine()
    slots = AdapterSlots(engine, AdapterFiles(None, tmp_path), max_loaded=2)
    assert await slots.forget("never") == "absent"
    await slots.load(_ref(tmp_path))
    assert await slots.forget(KEY) == "unloaded" and ("unload", KEY) in engine.log
    assert await slots.forget(KEY) == "forgotten"
    with pytest.raises(NotFoundError):
        await slots.load(_ref(tmp_path))  # a request resolved before the deletion
    await slots.load(_ref(tmp_path, key="ad_2"))  # a new upload under the same name loads
    assert slots.loaded == ["ad_2"] and engine.log[-1] == ("load", "ad_2")


async def test_the_chat_head_replica_drops_it_from_serve_and_the_engine(
    tmp_path: Path,
) -> None:
    engine = _Engine()
    slots = AdapterSlots(engine, AdapterFiles(None, tmp_path))
    await slots.load(_ref(tmp_path))
    core = ChatHeadCore.__new__(ChatHeadCore)
    core.adapters = slots
    model = MultiplexedAdapter(slots, KEY, asyncio.get_running_loop())
    wrapper = _Wrapper({KEY: model})
    head = SimpleNamespace(core=core, _multiplex_owner=_owner(wrapper))
    forget = ChatHead.func_or_class.forget_adapter
    assert await forget(head, KEY) == "unloaded"
    assert not wrapper.models and slots.loaded == [] and ("unload", KEY) in engine.log
    assert await forget(head, KEY) == "forgotten"
    assert await forget(head, "other") == "absent"
