"""Tool-decision eval: does the tool model call the right tool, or rightly none?

44 prompts written for this eval, each sent alone to ``POST /v1/responses`` with the
same tools declared (six function tools and the server tool ``web_search``),
``tool_choice: auto`` and temperature 0, as agent frameworks send them:

- ``function`` (22): needs one of the function tools; right when the first tool call
  is that function, its ``arguments`` parse as JSON and validate against the tool's
  schema, and no search ran;
- ``none`` (11): needs no tool (arithmetic, writing, greetings, general knowledge);
  right when no tool was called and the answer is not a call to a function nobody
  declared (``{"name": "multiply", ...}``, which the parser leaves as content);
- ``web_search`` (11): needs fresh or outside facts; right when the response's first
  tool call is a ``web_search_call`` with a non-empty query.

Printed per category: the share right, and its parts (call vs answer, which tool,
arguments valid). The per-prompt outcome goes to ``--out`` (JSON) for a diff between runs.

By default the model runs in this process through the project's own head code:
the catalog entry of ``qwen2.5-coder-1.5b-instruct`` from configs/catalog/local.yaml
(its vLLM engine settings, chat template and tool parser), a ``ChatHeadCore`` around
the real vLLM engine, and the gateway app (guidance, tool loop) with configs/local.yaml's
tool settings, no Ray. ``web_search`` uses the ``local`` provider as ``make run`` does,
on an empty index (a search answers "No results." at once: only the decision counts).
``--base-url``/``--api-key`` send the prompts to a running gateway instead.

    flock /tmp/heavy.lock .venv/bin/python -m bench.tool_decisions              # ~15 min, 2 cores
    .venv/bin/python -m bench.tool_decisions --base-url http://127.0.0.1:8000/v1 --api-key $KEY
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import re
import sys
import tempfile
import time
from collections.abc import AsyncIterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import httpx
import jsonschema
import yaml

REPO = Path(__file__).resolve().parent.parent
MODEL = "qwen2.5-coder-1.5b-instruct"


def _fn(name: str, description: str, props: dict[str, Any], required: list[str]) -> dict[str, Any]:
    parameters = {"type": "object", "properties": props, "required": required}
    return {"type": "function", "name": name, "description": description, "parameters": parameters}


_S = {"type": "string"}
FUNCTIONS: list[dict[str, Any]] = [
    _fn(
        "get_weather",
        "Current weather and today's forecast for a city.",
        {"city": _S, "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]}},
        ["city"],
    ),
    _fn(
        "convert_currency",
        "Convert an amount of money between currencies at today's exchange rate.",
        {
            "amount": {"type": "number"},
            "from_currency": {**_S, "description": "ISO 4217 code, e.g. USD"},
            "to_currency": {**_S, "description": "ISO 4217 code, e.g. EUR"},
        },
        ["amount", "from_currency", "to_currency"],
    ),
    _fn(
        "get_stock_price",
        "Latest trading price of a stock.",
        {"ticker": {**_S, "description": "Ticker symbol, e.g. AAPL"}},
        ["ticker"],
    ),
    _fn(
        "send_email",
        "Send an email on the user's behalf.",
        {"to": {**_S, "description": "Recipient address"}, "subject": _S, "body": _S},
        ["to", "subject", "body"],
    ),
    _fn(
        "create_calendar_event",
        "Add an event to the user's calendar.",
        {
            "title": _S,
            "date": {**_S, "description": "YYYY-MM-DD"},
            "time": {**_S, "description": "HH:MM, 24-hour"},
        },
        ["title", "date"],
    ),
    _fn(
        "get_order_status",
        "Shipping status of one of the user's orders in our shop.",
        {"order_id": _S},
        ["order_id"],
    ),
]
TOOLS: list[dict[str, Any]] = [*FUNCTIONS, {"type": "web_search"}]
SCHEMAS = {f["name"]: f["parameters"] for f in FUNCTIONS}

CASES: list[tuple[str, str, str | None]] = [
    # (category, prompt, expected tool)
    ("function", "What's the weather like in Paris right now?", "get_weather"),
    ("function", "Do I need an umbrella in London today?", "get_weather"),
    ("function", "How hot is it in Phoenix at the moment, in fahrenheit?", "get_weather"),
    ("function", "Tell me the current temperature in Tokyo.", "get_weather"),
    ("function", "Convert 250 US dollars to euros.", "convert_currency"),
    ("function", "How many Japanese yen do I get for 80 British pounds today?", "convert_currency"),
    ("function", "I have 1200 CHF. What is that in USD?", "convert_currency"),
    ("function", "What is Apple's stock trading at right now? Ticker AAPL.", "get_stock_price"),
    ("function", "Give me the latest price of NVDA.", "get_stock_price"),
    ("function", "How is Microsoft (MSFT) stock doing today?", "get_stock_price"),
    (
        "function",
        "Email bob@example.com that the meeting moved to 3pm, subject 'Meeting moved'.",
        "send_email",
    ),
    (
        "function",
        "Send an email to alice@example.org thanking her for the flowers.",
        "send_email",
    ),
    (
        "function",
        "Please write to hr@example.com that I will be on leave next Friday.",
        "send_email",
    ),
    (
        "function",
        "Put a dentist appointment on my calendar on 2026-12-03 at 10:00.",
        "create_calendar_event",
    ),
    (
        "function",
        "Add 'Team offsite' to my calendar for 2027-01-15.",
        "create_calendar_event",
    ),
    (
        "function",
        "Schedule a call with the bank on 2026-11-30 at 14:30 in my calendar.",
        "create_calendar_event",
    ),
    ("function", "Where is my order 48213?", "get_order_status"),
    ("function", "Has order A-7781 shipped yet?", "get_order_status"),
    ("function", "Check the status of my order number 99120, please.", "get_order_status"),
    ("function", "Is it snowing in Oslo?", "get_weather"),
    ("function", "What's 500 euros in Canadian dollars?", "convert_currency"),
    ("function", "What did Tesla (TSLA) stock last trade at?", "get_stock_price"),
    ("none", "What is 17 times 23?", None),
    ("none", "Write a haiku about autumn leaves.", None),
    ("none", "Translate 'good morning' into Spanish.", None),
    ("none", "Explain in one sentence what a Python list comprehension is.", None),
    ("none", "Hi! How are you?", None),
    ("none", "Thanks, that's all I needed.", None),
    ("none", "Write a Python function that reverses a string.", None),
    ("none", "What does HTTP stand for?", None),
    ("none", "Give me a synonym for 'happy'.", None),
    ("none", "Sort these numbers in ascending order: 5, 2, 9, 1.", None),
    ("none", "What is the capital of France?", None),
    ("web_search", "Search the web for the population of Lyon, then answer with a citation.", ""),
    ("web_search", "What are the latest news about the James Webb Space Telescope?", ""),
    ("web_search", "Find out who won the most recent Tour de France.", ""),
    ("web_search", "Look up the opening hours of the Louvre museum.", ""),
    ("web_search", "What is the newest released version of the Rust programming language?", ""),
    ("web_search", "Search for reviews of the Framework Laptop 16.", ""),
    ("web_search", "Who is the current prime minister of Japan? Check online.", ""),
    ("web_search", "Find recent research papers on retrieval-augmented generation.", ""),
    ("web_search", "What are today's top headlines?", ""),
    ("web_search", "Look up the official website of the Python Software Foundation.", ""),
    ("web_search", "Search the web for the height of the Eiffel Tower and cite your source.", ""),
]
"""The expected tool: a function name, ``None`` (no tool), ``""`` (web_search)."""


def split_of(case: tuple[str, str, str | None]) -> str:
    """``tune`` or ``held-out``: every other prompt of each category, in the order above.

    Wording changes (template, guidance) are chosen on ``tune`` alone; ``held-out``
    says whether they carry over to prompts nobody looked at while choosing.
    """
    same = [c for c in CASES if c[0] == case[0]]
    return "tune" if same.index(case) % 2 == 0 else "held-out"


@dataclass
class Outcome:
    category: str
    prompt: str
    expected: str | None
    tool: str | None = None
    """The first tool called: a function name, ``web_search``, or None (answered)."""
    arguments: str = ""
    args_valid: bool | None = None
    answer: str = ""
    error: str = ""
    seconds: float = 0.0
    calls: list[str] = field(default_factory=list)

    @property
    def invented_call(self) -> bool:
        """The answer is a call to a function nobody declared (``{"name": "multiply", ...}``):
        the parser rightly leaves it as content, but it answers nothing."""
        return _INVENTED.match(self.answer) is not None

    @property
    def decided_call(self) -> bool:
        return self.tool is not None or self.invented_call

    @property
    def right(self) -> bool:
        if self.error:
            return False
        if self.category == "none":
            return self.tool is None and not self.invented_call
        if self.category == "web_search":
            return self.tool == "web_search" and bool(self.arguments.strip())
        return self.tool == self.expected and bool(self.args_valid)


_INVENTED = re.compile(r'\s*(?:```(?:json)?\s*)?(?:<tool_call>\s*)?\{\s*"name"\s*:')


def _validate(name: str, raw: str) -> bool:
    try:
        jsonschema.validate(json.loads(raw), SCHEMAS[name])
    except (ValueError, jsonschema.ValidationError):
        return False
    return True


def read_response(outcome: Outcome, body: dict[str, Any]) -> None:
    """The decision, from the Response's output items in order."""
    for item in body.get("output") or []:
        kind = item.get("type")
        if kind == "function_call":
            outcome.calls.append(item.get("name", ""))
        elif kind == "web_search_call":
            outcome.calls.append("web_search")
        elif kind == "message":
            outcome.answer = "".join(p.get("text", "") for p in item.get("content") or [])
        if outcome.tool is None and kind == "function_call":
            outcome.tool, outcome.arguments = item.get("name"), item.get("arguments", "")
            name = outcome.tool or ""
            outcome.args_valid = name in SCHEMAS and _validate(name, outcome.arguments)
        elif outcome.tool is None and kind == "web_search_call":
            outcome.tool = "web_search"
            outcome.arguments = str((item.get("action") or {}).get("query") or "")


async def run_case(
    http: httpx.AsyncClient, case: tuple[str, str, str | None], max_tokens: int
) -> Outcome:
    category, prompt, expected = case
    outcome = Outcome(category, prompt, expected)
    body = {
        "model": MODEL,
        "input": prompt,
        "tools": TOOLS,
        "tool_choice": "auto",
        "temperature": 0,
        "max_output_tokens": max_tokens,
    }
    started = time.monotonic()
    try:
        reply = await http.post("/responses", json=body, timeout=900)
        if reply.status_code != 200:
            outcome.error = f"{reply.status_code} {reply.text[:200]}"
        else:
            read_response(outcome, reply.json())
    except httpx.HTTPError as err:
        outcome.error = f"{type(err).__name__}: {err}"
    outcome.seconds = round(time.monotonic() - started, 1)
    return outcome


def _share(part: list[bool]) -> str:
    return f"{sum(part)}/{len(part)} ({100 * sum(part) / len(part):.0f}%)" if part else "-"


def report(outcomes: list[Outcome]) -> str:
    lines = [
        f"{'category':<11} {'right':>13} {'call vs answer':>15} {'which tool':>13} {'args':>13}"
    ]
    for category in ("function", "none", "web_search"):
        rows = [o for o in outcomes if o.category == category]
        if not rows:
            continue
        should_call = category != "none"
        decided = [o.decided_call == should_call and not o.error for o in rows]
        called = [o for o in rows if o.decided_call and should_call]
        which = [o.tool == (o.expected or "web_search") for o in called]
        invented = sum(o.invented_call for o in rows)
        args = [bool(o.args_valid) for o in called if o.tool in SCHEMAS]
        right = _share([o.right for o in rows])
        lines.append(
            f"{category:<11} {right:>13} {_share(decided):>15} {_share(which):>13} "
            f"{_share(args):>13}" + (f"   ({invented} invented calls)" if invented else "")
        )
    lines.append(f"{'all':<11} {_share([o.right for o in outcomes]):>13}")
    return "\n".join(lines)


@contextlib.asynccontextmanager
async def in_process_gateway(
    state_dir: Path, *, answer_invented_calls: bool = True, on_core: Any = None
) -> AsyncIterator[httpx.AsyncClient]:
    """The gateway app with the real tool-model head in this process (no Ray)."""
    from deployments import registry
    from deployments.chat.head import ChatHeadCore
    from serve_app.auth.accounts import AccountStore
    from serve_app.composition import build_state
    from serve_app.config import GatewayAppArgs
    from serve_app.heads.client import LocalHeadClient
    from serve_app.inference.readiness import HeadReadiness
    from serve_app.ingress.app import create_app
    from serve_app.settings import GatewaySettings
    from serve_app.storage.db import Database

    catalog = yaml.safe_load((REPO / "configs/catalog/local.yaml").read_text())["models"]
    entry = next(m for m in catalog if m["id"] == MODEL)
    local = yaml.safe_load((REPO / "configs/local.yaml").read_text())
    args = next(a["args"] for a in local["applications"] if "tools" in (a.get("args") or {}))
    tools = dict(args["tools"])
    tools["web_search"] = {**tools["web_search"], "local": {"seed_paths": []}}
    config = GatewayAppArgs.model_validate({"catalog": [entry], "tools": tools})
    model = config.catalog[0]
    engine = registry.build_engine("chat", model.engine.backend, dict(model.engine.config))
    core = ChatHeadCore(engine, answer_invented_calls=answer_invented_calls)
    await core.start()
    if on_core is not None:  # an experiment's hook (a template to swap in, say)
        on_core(core)
    settings = GatewaySettings(
        database_url=f"sqlite:///{state_dir / 'gw.db'}", state_dir=state_dir, redis_url=None
    )
    database = Database(settings.resolved_database_url())
    database.migrate()
    state = build_state(
        config, {MODEL: LocalHeadClient(core)}, HeadReadiness(None), database, settings
    )
    accounts = AccountStore(database)
    key = accounts.create_key("eval", "eval")
    accounts.update_user("eval", web_search=True)
    app = create_app(state, config.max_body_bytes)
    async with httpx.AsyncClient(
        transport=httpx.ASGITransport(app=app),
        base_url="http://gateway.eval/v1",
        headers={"Authorization": f"Bearer {key}"},
    ) as http:
        yield http
    await state.text.metering.aclose()


async def main_async(opts: argparse.Namespace) -> list[Outcome]:
    cases = [c for c in CASES if opts.category in (None, c[0])]
    cases = [c for c in cases if opts.split in (None, split_of(c))][: opts.limit]
    if opts.base_url:
        headers = {"Authorization": f"Bearer {opts.api_key}"}
        context: Any = httpx.AsyncClient(base_url=opts.base_url, headers=headers)
    else:
        context = in_process_gateway(
            Path(tempfile.mkdtemp(prefix="tool-eval-")), answer_invented_calls=opts.retry
        )
    gate = asyncio.Semaphore(opts.concurrency)

    async def one(http: httpx.AsyncClient, case: tuple[str, str, str | None]) -> Outcome:
        async with gate:
            outcome = await run_case(http, case, opts.max_tokens)
        mark = "ok " if outcome.right else "BAD"
        print(
            f"{mark} {outcome.seconds:6.1f}s {outcome.category:<10} -> {outcome.tool or '-'} "
            f"{outcome.arguments[:60]!r} {outcome.error[:80]} | {outcome.prompt[:50]}",
            flush=True,
        )
        return outcome

    started = time.monotonic()
    async with context as http:
        outcomes = list(await asyncio.gather(*(one(http, c) for c in cases)))
    print(f"\n{len(cases)} prompts in {time.monotonic() - started:.0f} s")
    return outcomes


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--base-url", help="a running gateway's /v1 (default: in-process)")
    parser.add_argument("--api-key", default="")
    parser.add_argument("--max-tokens", type=int, default=64, help="max_output_tokens")
    parser.add_argument("--concurrency", type=int, default=4)
    parser.add_argument("--category", choices=["function", "none", "web_search"])
    parser.add_argument("--split", choices=["tune", "held-out"], help="only this half")
    parser.add_argument("--limit", type=int, help="only the first N prompts")
    parser.add_argument(
        "--no-retry",
        dest="retry",
        action="store_false",
        help="in-process: keep a call to an undeclared function as the answer (the model's "
        "first decision) instead of answering again without tools",
    )
    parser.add_argument("--out", type=Path, help="per-prompt outcomes as JSON")
    opts = parser.parse_args(argv)
    outcomes = asyncio.run(main_async(opts))
    print(report(outcomes))
    for half in ("tune", "held-out"):
        part = [o for o in outcomes if split_of((o.category, o.prompt, o.expected)) == half]
        if part and len(part) < len(outcomes):
            print(f"{half:<11} {_share([o.right for o in part]):>13}")
    if opts.out:
        rows = [{**asdict(o), "right": o.right} for o in outcomes]
        opts.out.write_text(json.dumps(rows, indent=1, ensure_ascii=False) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
