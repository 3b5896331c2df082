"""Prefix-, adapter- and organization-aware request routing for chat heads (Ray Serve).

Ray Serve LLM's ``PrefixCacheAffinityRouter`` already does the work: a prefix tree (one
detached actor per deployment, shared by every router of it) of the text each replica was
sent, a queue-length imbalance check that falls back to power-of-two choices, Serve's
multiplexing for adapters, and the clean-up of a dead or removed replica's entries
(``on_replica_actor_died``, ``update_replicas``). Its text extraction reads ``messages`` or
``prompt`` attributes of an argument; a chat head's argument is a ``HeadRequest``
(``serve_app.contract.chat``), whose prompts are a list of ``PromptSpec``. This subclass
changes that extraction (``routing_text``), maps the catalog's settings onto the router's
(``router_kwargs``), and replaces the one decision Ray gets wrong for agent traffic (where a
new conversation goes, and whose queue the imbalance margin is measured on:
``ChatPrefixRouter._prefix_match_best_replicas``); the tree, the adapter and locality
filtering and the replica bookkeeping stay Ray's.

Why the messages' text and not the rendered prompt: the gateway never renders (the head
does, with the model's tokenizer), so no rendered text reaches the router. The chat
template is a function of the tools and of the messages in order, so the rendered prompt
of a conversation is a prefix of the next turn's exactly when the tools and earlier
messages are; the concatenation below (tools, then each message's role and text, in
order) keeps that prefix relation, which is all a prefix tree needs.

The text is keyed by a namespace first (``namespace``): the organization and the adapter
(or the base model). Two organizations sending the same system prompt then never match
each other's entries, so one organization's traffic cannot steer, or reveal by steering,
where another's lands; and a base request never prefers a replica for an adapter request's
prefix (their KV caches differ: vLLM keys cached blocks by the LoRA too).
"""

from __future__ import annotations

import hashlib
import json
import time
import uuid
from typing import Any

import ray
from ray.llm._internal.serve.routing_policies.prefix_aware.prefix_aware_router import (
    PrefixCacheAffinityRouter,
)
from ray.llm._internal.serve.routing_policies.prefix_aware.prefix_tree import PrefixTree
from ray.serve._private.constants import SERVE_CONTROLLER_NAME, SERVE_NAMESPACE
from ray.serve.request_router import PendingRequest

from serve_app.contract.chat import HeadRequest, PromptSpec

ROUTER_CLASS = "deployments.chat.prefix_router:ChatPrefixRouter"
"""Import path Serve loads the router from (``request_router_config``)."""

_SEPARATOR = "\x1e"
"""Between messages: a record separator no client text is expected to need."""


def namespace(request: HeadRequest) -> str:
    """The tree's key prefix: a short digest of (organization, adapter or base).

    A digest, not the ids themselves: the tree actor then holds no organization id, and
    every namespace costs the same few characters of the match-rate arithmetic.
    """
    adapter = request.adapter.key if request.adapter is not None else ""
    raw = f"{request.org_id or ''}\x00{adapter}".encode()
    return hashlib.blake2b(raw, digest_size=8).hexdigest() + _SEPARATOR


def _content_text(content: Any) -> str:
    """A message's content as text: strings and text parts as given, other parts (images,
    audio) by their JSON, so two different images never look alike."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(_content_text(part) for part in content)
    if isinstance(content, dict) and isinstance(content.get("text"), str):
        return str(content["text"])
    return json.dumps(content, sort_keys=True, default=str)


def prompt_text(prompt: PromptSpec) -> str:
    """What the engine will see of one prompt, as text, in the order it renders it."""
    if prompt.prompt is not None:
        return prompt.prompt
    if prompt.token_ids is not None:
        return " ".join(str(t) for t in prompt.token_ids)
    parts = [json.dumps(prompt.tools, sort_keys=True, default=str)] if prompt.tools else []
    for message in prompt.messages or []:
        role = str(message.get("role", ""))
        parts.append(f"{role}:{_content_text(message.get('content'))}")
        if message.get("tool_calls"):
            parts.append(json.dumps(message["tool_calls"], sort_keys=True, default=str))
    return _SEPARATOR.join(parts)


def routing_text(request: HeadRequest) -> str:
    """The namespaced text a request is routed (and recorded) by; its first prompt's only:
    a legacy completion with several prompts is one request to one replica."""
    text = prompt_text(request.prompts[0]) if request.prompts else ""
    return namespace(request) + text


def router_kwargs(imbalance: int, tree_chars: int) -> dict[str, Any]:
    """The catalog's settings as ``PrefixCacheAffinityRouter.initialize_state`` arguments.

    ``imbalance``: the affinity replica is skipped (power of two choices instead) when the
    longest queue exceeds the shortest by more than this many requests. ``tree_chars``:
    the tree is trimmed (least recently used first) to 90% of this when it grows past it.
    """
    return {
        "imbalanced_threshold": imbalance,
        "do_eviction": True,
        "eviction_threshold_chars": tree_chars,
        "eviction_target_chars": tree_chars * 9 // 10,
    }


PEER_WINDOW_S = 60.0
"""A router that recorded nothing for this long no longer counts as routing beside another."""


class FastPrefixTree(PrefixTree):
    """Ray's ``PrefixTree`` with a shared-prefix count that compares in C, and a count of the
    routers writing to it (``insert_from``).

    Ray counts with ``os.path.commonprefix``, a Python loop per character: on agent
    prompts (6,000 characters) that was 1.2 ms per compared edge, several per request
    (bench/router_overhead.py). Halving slices compares each character at most twice,
    at C speed.
    """

    def __init__(self) -> None:
        super().__init__()
        self._routers: dict[str, float] = {}
        """Router id -> when it last recorded (``insert_from``)."""

    @staticmethod
    def _shared_prefix_count(a: str, b: str) -> int:
        n = min(len(a), len(b))
        if a[:n] == b[:n]:
            return n
        low, high = 0, n  # a[:low] == b[:low]; a[:high] != b[:high]
        while high - low > 1:
            mid = (low + high) // 2
            if a[low:mid] == b[low:mid]:
                low = mid
            else:
                high = mid
        return low

    def insert_from(self, router: str, text: str, tenant: str, time_s: float) -> int:
        """``insert``, answering how many routers recorded in the last ``PEER_WINDOW_S``
        (the caller included): a router alone in that window need not ask this tree about
        a conversation its own copy does not know, since no one else routed it."""
        self.insert(text, tenant, time_s)
        self._routers[router] = time_s
        self._routers = {r: t for r, t in self._routers.items() if t >= time_s - PEER_WINDOW_S}
        return len(self._routers)

    def tenants(self) -> list[str]:
        """The replicas the tree holds entries for (full replica ids): for operators and
        tests, as the actor's state cannot be read otherwise."""
        return list(self.tenant_to_char_count)


FastPrefixTreeActor = ray.remote(FastPrefixTree)


class ChatPrefixRouter(PrefixCacheAffinityRouter):
    """``PrefixCacheAffinityRouter`` reading a chat head's ``HeadRequest``."""

    def initialize_state(self, tree_actor: Any = None, **kwargs: Any) -> None:  # type: ignore[override]
        """Ray's state, on a ``FastPrefixTree`` actor: named and detached per deployment
        as Ray names its own (every router of the deployment shares it), and handed to
        the Serve controller to end at ``serve.shutdown``, as Ray does."""
        if tree_actor is None:
            deployment = self._deployment_id
            tree_actor = FastPrefixTreeActor.options(
                name="ChatPrefixTreeActor",
                namespace=f"{SERVE_NAMESPACE}::{deployment.app_name}::{deployment.name}",
                get_if_exists=True,
                lifetime="detached",
            ).remote()
            controller = ray.get_actor(SERVE_CONTROLLER_NAME, namespace=SERVE_NAMESPACE)
            ray.get(controller._register_shutdown_cleanup_actor.remote(tree_actor))
        super().initialize_state(tree_actor=tree_actor, **kwargs)
        self._turn = 0  # rotates ties among new conversations (_prefix_match_best_replicas)
        # This router's own copy of what it routed: a conversation's next turn through the
        # same gateway replica is matched here, in process (~0.1 ms), instead of by a round
        # trip to the shared actor (~1-2 ms, over issue 43's 1 ms budget). The actor is asked
        # only when this copy knows too little (a new conversation here, or one whose earlier
        # turns went through another gateway replica).
        self._local = FastPrefixTree()
        self._router_id = uuid.uuid4().hex
        self._alone = False  # until the shared tree says no other router records
        threshold, target = self._eviction_threshold_chars, self._eviction_target_chars
        if self._do_eviction and threshold is not None and target is not None:
            self._local.start_eviction_loop(threshold, target, self._eviction_interval_secs or 10)

    def update_replicas(self, replicas: list[Any]) -> None:
        """Ray's bookkeeping (the shared tree's tenants), and the same in the local copy."""
        super().update_replicas(replicas)
        current = {r.replica_id.to_full_id_str() for r in replicas}
        known = set(self._local.tenant_to_char_count)
        if current - known:
            self._local.add_tenants(sorted(current - known), time.time())
        if known - current:
            self._local.remove_tenants(sorted(known - current))

    def on_replica_actor_died(self, replica_id: Any) -> None:
        """Ray's clean-up (the shared tree), and the local copy's."""
        super().on_replica_actor_died(replica_id)
        self._local.remove_tenants([replica_id.to_full_id_str()])

    def _extract_text_from_request(self, pending_request: PendingRequest) -> str:
        for arg in pending_request.args:
            if isinstance(arg, HeadRequest):
                return routing_text(arg)
        # Not a generation (an adapter's forget, a wake): the parent's extraction would
        # raise; an empty text makes the router fall back to its default choice.
        return ""

    async def _prefix_match_best_replicas(
        self, pending_request: PendingRequest | None, candidate_replicas: list[Any]
    ) -> list[Any]:
        """The replicas to try first: those holding the longest prefix, unless their queue is
        longer than the shortest by more than the margin; else the least loaded.

        Ray's version differs in two ways that cost an agent trace its cache (issue 43's
        bench: a 0.70 hit rate where perfect affinity gives ~0.8). (1) It ignores the prefix
        whenever *any* two replicas' queues differ by more than the margin, even when the
        replica holding the prefix is the shorter one; the margin belongs to the holder.
        (2) A new conversation (under 10% matched) goes to the replica with the least text
        remembered: a sum of history, not load, and inserts land only after a request is
        accepted, so a burst of new conversations all sees the same "smallest" replica and
        piles onto it, after which the margin sends their next turns elsewhere (misses).
        Here a new conversation goes to the shortest queue (Serve's cache counts requests as
        they are sent), ties taken in turn, so a burst spreads evenly.
        """
        text = self._extract_text_from_request(pending_request) if pending_request else ""
        if not text or not candidate_replicas:
            return [[]]  # not a generation: the parent's default choice
        queues = await self._queue_lens(candidate_replicas)
        shortest = min(queues.values(), default=0)
        ids = [r.replica_id.to_full_id_str() for r in candidate_replicas]
        threshold = self._match_rate_threshold or 0.0

        def known(match: tuple[str, list[str] | None]) -> bool:
            return bool(match[1]) and len(match[0]) / len(text) >= threshold

        match = self._local.prefix_match(text, ids)
        if not self._alone and not known(match):
            # Awaited, not ``ray.get`` as Ray does: the router's loop keeps routing meanwhile.
            match = await self._tree_actor.prefix_match.remote(text, ids)
        holders = match[1] or []
        margin = self._imbalanced_threshold if self._imbalanced_threshold is not None else 0.0
        if known(match):
            within = [
                r
                for r in candidate_replicas
                if r.replica_id.to_full_id_str() in holders
                and r.replica_id in queues
                and queues[r.replica_id] - shortest <= margin
            ]
            if within:
                return [within]
        # The least loaded, ties taken in turn (Serve's own pick among equals is random,
        # which splits a burst of new conversations unevenly).
        least = [r for r in candidate_replicas if queues.get(r.replica_id) == shortest]
        least = least or candidate_replicas
        self._turn += 1
        return [[least[self._turn % len(least)]]]

    async def _queue_lens(self, replicas: list[Any]) -> dict[Any, int]:
        """Each replica's queue length: Serve's cache (which counts a request as it is sent),
        else a probe, as Ray's router reads them. A replica that does not answer is left out."""
        queues: dict[Any, int] = {}
        unknown = []
        for r in replicas:
            cached = (
                self._replica_queue_len_cache.get(r.replica_id)
                if self._use_replica_queue_len_cache
                else None
            )
            if cached is None or cached >= r.max_ongoing_requests:
                unknown.append(r)
            else:
                queues[r.replica_id] = cached
        if unknown:
            for r, queue in await self._probe_queue_lens(unknown, 0):
                if queue is not None:
                    queues[r.replica_id] = queue
        return queues

    def on_request_routed(self, pending_request: PendingRequest, replica_id: Any, result: Any):  # type: ignore[no-untyped-def]
        """Record where the text went, without waiting for the tree: Ray's version blocks the
        router's loop on the insert's answer, which nothing reads (one actor round trip per
        request, half the router's cost in bench/router_overhead.py). Calls from one router
        reach the actor in order, so this router's next match sees the insert."""
        if pending_request is None:
            return
        text = self._extract_text_from_request(pending_request)
        if text:
            now, tenant = time.time(), replica_id.to_full_id_str()
            self._local.insert(text, tenant, now)
            ref = self._tree_actor.insert_from.remote(self._router_id, text, tenant, now)
            ref.future().add_done_callback(self._note_routers)

    def _note_routers(self, answer: Any) -> None:
        """The shared tree's count of routers recording (``FastPrefixTree.insert_from``); on
        any failure the router keeps asking the tree (``_alone`` stays or turns false)."""
        try:
            self._alone = answer.result() <= 1
        except Exception:
            self._alone = False
