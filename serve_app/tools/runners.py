"""Running one server-tool call: budgets, the backends, and what the model reads.

``ToolRuntime`` holds the backends of a replica (search provider, fetcher,
sandbox); ``ToolBox`` is one request's view of them: it counts calls against
the plan's budgets, numbers sources for citations, and turns every outcome,
failures included, into a ``ToolCallRecord`` (the output item) and the text
fed back to the model. A backend failure is a ``failed`` record, never an
exception: the request goes on (docs/reference/responses.md#output-items,
docs/reference/chat.md#server-tools).
"""

from __future__ import annotations

import json
import logging
import math
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, cast

from serve_app.contract.chat import ToolCallDelta
from serve_app.contract.sandbox import CodeRun, SandboxUnavailableError
from serve_app.protocol.responses import ServerToolCallItem, ServerToolItemType
from serve_app.tools.citations import SourceList
from serve_app.tools.config import ToolsOptions
from serve_app.tools.declarations import CODE_SECONDS_PER_REQUEST, ServerToolPlan
from serve_app.tools.guidance import CITATION_RULE, NO_SOURCES, SearchScope
from serve_app.tools.local_search import LocalSearchProvider
from serve_app.tools.safe_fetch import FetchError, SafeFetcher
from serve_app.tools.sandbox import CodeSandbox
from serve_app.tools.search import SearchError, SearchProvider, build_search_provider
from serve_app.tools.webpage import page_text

logger = logging.getLogger(__name__)

ItemStatus = Literal["in_progress", "completed", "failed"]
_ITEM_PREFIX = {"web_search": "ws", "web_fetch": "wf", "code_interpreter": "ci"}
_MIN_CODE_SECONDS = 1.0


@dataclass
class ToolCallRecord:
    """One executed server-tool call: a ``<tool>_call`` output item
    (docs/reference/responses.md#output-items)."""

    id: str
    kind: str
    action: dict[str, Any]
    call_id: str
    status: ItemStatus = "in_progress"
    error: str | None = None
    logs: str | None = None  # code_interpreter output (what it printed)

    def item(self) -> ServerToolCallItem:
        item: ServerToolCallItem = {
            "id": self.id,
            "type": cast(ServerToolItemType, f"{self.kind}_call"),
            "status": self.status,
            "action": self.action,
        }
        if self.kind == "code_interpreter" and self.status != "in_progress":
            item["outputs"] = [{"type": "logs", "logs": self.logs or ""}]
        if self.error is not None:
            item["error"] = {"message": self.error}
        return item


@dataclass
class ToolRuntime:
    """The tool backends of one gateway replica."""

    options: ToolsOptions
    search: SearchProvider
    fetcher: SafeFetcher
    sandbox: CodeSandbox

    @classmethod
    def from_options(
        cls,
        options: ToolsOptions,
        state_dir: Path | None = None,
        *,
        sandbox: CodeSandbox,
        seed_root: Path,
    ) -> ToolRuntime:
        """``state_dir``: where the ``local`` search provider finds its index by default;
        ``sandbox``: the tool-runner deployment's client, or the in-process sandbox
        (the composition root chooses); ``seed_root``: what the ``local`` index's relative
        seed paths are relative to (the repository root)."""
        fetch = options.web_fetch
        return cls(
            options=options,
            search=build_search_provider(options.web_search, state_dir, seed_root),
            fetcher=SafeFetcher(
                timeout_s=fetch.timeout_s,
                max_bytes=fetch.max_bytes,
                max_redirects=fetch.max_redirects,
                allow_private_hosts=fetch.allow_private_hosts,
            ),
            sandbox=sandbox,
        )

    @property
    def search_scope(self) -> SearchScope:
        """What ``web_search`` searches here, as the model is told (guidance, schema)."""
        return "local" if isinstance(self.search, LocalSearchProvider) else "web"


@dataclass
class Refusal:
    """A call that was not run (budget spent, unknown tool): only the model hears of it."""

    message: str


@dataclass
class ToolBox:
    """One request's tool state: budgets used, sources, billable quantities."""

    runtime: ToolRuntime
    plan: ServerToolPlan
    used: dict[str, int] = field(default_factory=dict)
    searches: int = 0
    code_seconds: float = 0.0
    billed_seconds: float = 0.0
    sources: SourceList = field(default_factory=SourceList)
    action_sources: bool = False
    """Each search's result URLs go on its item's ``action.sources`` (responses
    ``include: [web_search_call.action.sources]``)."""
    _billed: tuple[int, float] = (0, 0.0)

    def live_tools(self) -> list[str]:
        """Declared tools with budget left (the ones offered to the model this turn)."""
        return [k for k, n in self.plan.budgets.items() if self.used.get(k, 0) < n]

    def prepare(self, call: ToolCallDelta) -> ToolCallRecord | Refusal:
        kind = call.name
        if not self.plan.allows(kind):
            return Refusal(f"error: there is no tool named {kind!r}")
        if self.used.get(kind, 0) >= self.plan.budgets[kind]:
            return Refusal(f"error: the {kind} budget of this request is spent; answer now")
        if kind == "code_interpreter" and self._code_time_left() < _MIN_CODE_SECONDS:
            return Refusal("error: the code time budget of this request is spent; answer now")
        self.used[kind] = self.used.get(kind, 0) + 1
        action = _action(kind, call.arguments)
        record_id = f"{_ITEM_PREFIX[kind]}_{uuid.uuid4().hex[:24]}"
        return ToolCallRecord(record_id, kind, action, call.id)

    def _code_time_left(self) -> float:
        return CODE_SECONDS_PER_REQUEST - self.code_seconds

    async def run(self, record: ToolCallRecord) -> str:
        """Execute; update ``record``; return what the model reads."""
        try:
            if record.kind == "web_search":
                text = await self._search(record)
            elif record.kind == "web_fetch":
                text = await self._fetch(record)
            else:
                text = await self._code(record)
        except (SearchError, FetchError, SandboxUnavailableError, ValueError) as err:
            return _failed(record, str(err))
        except Exception as err:
            logger.exception("%s failed", record.kind)
            return _failed(record, f"{record.kind} failed ({type(err).__name__})")
        record.status = "completed"
        return text

    async def _search(self, record: ToolCallRecord) -> str:
        query = str(record.action.get("query") or "").strip()
        if not query:
            raise ValueError("web_search needs a non-empty query")
        hits = await self.runtime.search.search(query, self.plan.results_per_search)
        self.searches += 1  # billed: the provider answered
        if self.action_sources:
            record.action["sources"] = [{"type": "url", "url": hit.url} for hit in hits]
        if not hits:
            return NO_SOURCES if not self.sources else "No results."
        lines = []
        for hit in hits:
            source = self.sources.add(hit.url, hit.title)
            lines.append(f"[{source.index}] {hit.title}\nURL: {hit.url}\n{hit.snippet}".strip())
        return "\n\n".join(lines) + "\n\n" + CITATION_RULE

    async def _fetch(self, record: ToolCallRecord) -> str:
        url = str(record.action.get("url") or "").strip()
        if not url:
            raise ValueError("web_fetch needs a url")
        stored = await self._stored_page(url)
        if stored is not None:
            title, text = stored
        else:
            page = await self.runtime.fetcher.get(url)
            title, text = page_text(page, self.runtime.options.web_fetch.max_chars)
        source = self.sources.add(url, title)
        return f"[{source.index}] {title}\nURL: {url}\n\n{text}\n\n{CITATION_RULE}"

    async def _stored_page(self, url: str) -> tuple[str, str] | None:
        """A page of the local search index, read without the network (``serve_fetches``)."""
        search = self.runtime.search
        if not isinstance(search, LocalSearchProvider):
            return None
        if not self.runtime.options.web_search.local.serve_fetches:
            return None
        stored = await search.stored_page(url)
        if stored is None:
            return None
        title, text = stored
        limit = self.runtime.options.web_fetch.max_chars
        if len(text) > limit:
            text = text[:limit] + "\n[truncated]"
        return title or url, text

    async def _code(self, record: ToolCallRecord) -> str:
        code = str(record.action.get("arguments", {}).get("code") or "")
        if not code.strip():
            raise ValueError("code_interpreter needs code")
        timeout = min(self.plan.code_timeout_s, self._code_time_left())
        run: CodeRun = await self.runtime.sandbox.run(code, timeout)
        self.code_seconds += run.seconds
        self.billed_seconds += float(math.ceil(run.seconds))
        record.logs = run.stdout + (run.stderr if run.stderr else "")
        return run.text_for_model()

    def take_billable(self) -> tuple[int, float]:
        """Searches and code seconds since the last call, for the usage record.

        docs/reference/chat.md#server-tools: searches per executed search (the provider answered),
        code per second: each run's wall time rounded up to whole seconds.
        """
        searches = self.searches - self._billed[0]
        seconds = self.billed_seconds - self._billed[1]
        self._billed = (self.searches, self.billed_seconds)
        return searches, seconds


def _failed(record: ToolCallRecord, message: str) -> str:
    record.status = "failed"
    record.error = message
    return f"error: {message}"


def _action(kind: str, raw_arguments: str) -> dict[str, Any]:
    """The item's ``action`` from the model's arguments (lenient: raw text is accepted)."""
    try:
        args = json.loads(raw_arguments) if raw_arguments.strip() else {}
    except ValueError:
        args = raw_arguments
    if kind == "web_search":
        query = args.get("query") if isinstance(args, dict) else args
        return {"type": "search", "query": str(query or "")}
    if kind == "web_fetch":
        url = args.get("url") if isinstance(args, dict) else args
        return {"type": "fetch", "url": str(url or "")}
    code = args.get("code") if isinstance(args, dict) else args
    return {"type": "call", "arguments": {"code": str(code or "")}}
