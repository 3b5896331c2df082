"""Server-tool declarations, budgets, guidance and citations (docs/reference/chat.md,
docs/reference/responses.md#response-object, docs/reference/common.md#limits)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from serve_app.contract.sandbox import CodeRun
from serve_app.protocol.errors import InvalidRequestError
from serve_app.tools.citations import SourceList
from serve_app.tools.config import ToolsOptions
from serve_app.tools.declarations import build_plan, split_tools
from serve_app.tools.guidance import guidance_text, merge_guidance, tool_schemas
from serve_app.tools.runners import ToolRuntime


def plan_of(tools: list[dict[str, Any]], options: dict[str, Any] | None = None) -> Any:
    _, servers = split_tools(tools)
    return build_plan(servers, options)


def test_default_budgets_and_context_size() -> None:
    plan = plan_of([{"type": "web_search"}, {"type": "web_fetch"}, {"type": "code_interpreter"}])
    assert plan.budgets == {"web_search": 6, "web_fetch": 3, "code_interpreter": 4}
    assert plan.results_per_search == 5
    assert plan.code_timeout_s == 20.0


def test_max_uses_only_lowers() -> None:
    plan = plan_of([{"type": "web_search", "max_uses": 2}, {"type": "web_fetch", "max_uses": 50}])
    assert plan.budgets == {"web_search": 2, "web_fetch": 3}


@pytest.mark.parametrize(("size", "results"), [("low", 3), ("medium", 5), ("high", 8)])
def test_search_context_size(size: str, results: int) -> None:
    assert plan_of([{"type": "web_search", "search_context_size": size}]).results_per_search == (
        results
    )


@pytest.mark.parametrize(("given", "effective"), [(1, 5.0), (12, 12.0), (60, 20.0)])
def test_code_timeout_is_clamped(given: float, effective: float) -> None:
    assert plan_of([{"type": "code_interpreter", "timeout_s": given}]).code_timeout_s == effective


@pytest.mark.parametrize(
    ("tool", "param"),
    [
        ({"type": "web_search", "max_uses": 0}, "tools[0].max_uses"),
        ({"type": "web_search", "max_uses": True}, "tools[0].max_uses"),
        ({"type": "web_search", "search_context_size": "huge"}, "tools[0].search_context_size"),
        ({"type": "web_fetch", "search_context_size": "low"}, "tools[0].search_context_size"),
        ({"type": "web_search", "timeout_s": 5}, "tools[0].timeout_s"),
        ({"type": "code_interpreter", "timeout_s": "5"}, "tools[0].timeout_s"),
        ({"type": "file_search"}, "tools"),
    ],
)
def test_bad_declarations_name_the_param(tool: dict[str, Any], param: str) -> None:
    with pytest.raises(InvalidRequestError) as info:
        plan_of([tool])
    assert info.value.param == param


def test_duplicates_merge_when_they_agree_and_fail_when_not() -> None:
    assert plan_of([{"type": "web_fetch"}, {"type": "web_fetch"}]).budgets == {"web_fetch": 3}
    with pytest.raises(InvalidRequestError) as info:
        plan_of([{"type": "web_fetch"}, {"type": "web_fetch", "max_uses": 1}])
    assert info.value.param == "tools[1]"


def test_web_search_options_is_the_same_switch() -> None:
    alone = plan_of([], {"search_context_size": "high"})
    assert alone.budgets == {"web_search": 6} and alone.results_per_search == 8
    merged = plan_of([{"type": "web_search", "search_context_size": "low"}], {})
    assert merged.results_per_search == 3
    agreeing = plan_of(
        [{"type": "web_search", "search_context_size": "low"}], {"search_context_size": "low"}
    )
    assert agreeing.results_per_search == 3
    with pytest.raises(InvalidRequestError) as info:
        plan_of(
            [{"type": "web_search", "search_context_size": "low"}],
            {"search_context_size": "high"},
        )
    assert info.value.param == "web_search_options.search_context_size"


def test_guidance_joins_the_first_system_turn() -> None:
    merged = merge_guidance(
        [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "hi"}], "G"
    )
    assert merged[0] == {"role": "system", "content": "Be brief.\n\nG"}
    assert [m["role"] for m in merged] == ["system", "user"]
    inserted = merge_guidance([{"role": "user", "content": "hi"}], "G")
    assert inserted[0] == {"role": "system", "content": "G"}


def test_guidance_says_what_web_search_searches() -> None:
    plan = plan_of([{"type": "web_search"}, {"type": "code_interpreter"}])
    web = guidance_text(plan, search_scope="web")
    local = guidance_text(plan, search_scope="local")
    assert "on the web" in web and "indexed on this service" not in web
    assert "indexed on this service" in local and "not the live web" in local
    assert "look things up on the web" not in local
    for text in (web, local):  # the rest of the guidance does not depend on the provider
        assert "code_interpreter to run Python" in text and "Call web_search when" in text
        assert "[1]" not in text  # how to cite comes with the results, never before

    def search_description(scope: Any) -> str:
        schemas = tool_schemas(plan, list(plan.budgets), search_scope=scope)
        (search,) = (s["function"] for s in schemas if s["function"]["name"] == "web_search")
        assert search["parameters"]["required"] == ["query"]
        return str(search["description"])

    assert search_description("web").startswith("Search the web.")
    assert "not the live web" in search_description("local")


class _NoSandbox:
    """The search scope does not depend on the sandbox; any code run here is a test bug."""

    async def run(self, code: str, timeout_s: float) -> CodeRun:
        raise AssertionError("no code runs in this test")


def test_the_runtime_names_its_search_scope(tmp_path: Path) -> None:
    def scope(web_search: dict[str, Any]) -> str:
        options = ToolsOptions.model_validate({"web_search": web_search})
        runtime = ToolRuntime.from_options(
            options, state_dir=tmp_path, sandbox=_NoSandbox(), seed_root=tmp_path
        )
        return runtime.search_scope

    assert scope({"provider": "local"}) == "local"
    assert scope({"provider": "searxng", "url": "http://127.0.0.1:9"}) == "web"
    brave = "https://api.search.brave.com/res/v1/web/search"
    assert scope({"provider": "brave", "url": brave, "api_key_env": "NO_SUCH_KEY"}) == "web"
    assert scope({"provider": "none"}) == "web"


def test_citations_index_spans_and_uncited_sources() -> None:
    sources = SourceList()
    first = sources.add("https://a.example/", "A")
    sources.add("https://b.example/", "B")
    assert sources.add("https://a.example/", "A again") is first  # a URL keeps its number
    sources.add("https://c.example/", "C")
    text = "Alpha [3] and beta [1, 9]."
    cited = sources.citations(text)
    assert [(c.source.index, c.start_index, c.end_index) for c in cited] == [
        (3, 6, 9),
        (1, 19, 25),
        (2, len(text), len(text)),  # never referenced: empty span at the end
    ]
    assert cited[0].for_responses() == {
        "type": "url_citation",
        "url": "https://c.example/",
        "title": "C",
        "index": 3,
        "start_index": 6,
        "end_index": 9,
    }
    assert cited[1].for_chat()["url_citation"]["index"] == 1
