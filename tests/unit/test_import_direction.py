"""Dependencies point one way (ARCHITECTURE.md, "Boundaries"); this test holds them there.

Every ``.py`` file of ``serve_app`` and ``deployments`` is parsed (never imported)
and every import in it is checked: module level, inside functions and
``TYPE_CHECKING`` blocks, ``import x``, ``from x import y``, relative imports,
and ``importlib.import_module("literal")``. A failure lists each offending
``file:line``. The rules:

- the heads (``deployments``) reach the gateway only through ``serve_app.contract``;
- ``serve_app.contract`` imports neither the rest of ``serve_app`` nor ``deployments``;
- in the gateway only the composition root (``serve_app.composition``), the Serve
  builder (``serve_app.builders``) and the CLI import ``deployments``: every other
  module, the head clients included, reaches heads through handles and the contract;
- the head clients (``serve_app.heads``) sit below the services that call them and
  import no service, route, ingress or root;
- the foundations (auth, limits, billing, storage, catalog) import no service,
  route or ingress module, and no head;
- ``serve_app.routes`` is the top of the request path: only the ingress (which assembles
  the app) imports it;
- the app assembly (``serve_app.ingress``: the Serve class, the app, middleware, the error
  mapper) sits above the routes: only the Serve builder imports it, so neither a route nor
  what the routes import (``serve_app.requests``: caller dependencies, ``GatewayState``,
  the OpenAPI error responses, the replay store) nor the composition root climbs back;
- ``serve_app.requests`` sits below the routes: it imports no route and no assembly;
- the HTTP layers stay HTTP: the services (``inference``) and the tools import nothing
  from ``serve_app.ingress`` or ``serve_app.requests`` (stream handling lives in
  ``serve_app.inference.streams``);
- the wire types (``serve_app.protocol``) import only themselves and the contract: no
  service, store, route or head (a rule the API validates by lives in ``protocol``, and
  the service imports it from there);
- ``serve_app.tools`` holds the tool backends (sandbox client, search, fetch,
  citations, declarations) and ``serve_app.outbound`` the one address guard: both
  sit below the services, so neither imports ``inference``, ``jobs``, ``dedicated``,
  the HTTP layers or the config (``serve_app.config``: what they need of it is handed
  down by the composition root); the tool-calling loop that runs the backends is a service
  (``serve_app.inference.chat.tool_loop``, ``chat.tools``);
- the services (``serve_app.inference``, ``batches``, ``files``, ``adapters``) and the wire
  types (``protocol``) speak no web framework
  (neither ``fastapi`` nor ``starlette``): a service returns an answer
  (``serve_app.inference.answers``: a ``Body`` or a ``FrameStream``) and the route
  makes it the HTTP response (``serve_app.routes.answers.http_response``).

And no module imports itself back through others: the graph of these imports (every
import counted, function-level ones too, each to the most specific module of the tree
it names) has no cycle. A cycle hidden in a function still decides which module must be
imported first, and it makes the two halves one unit nobody can read alone; the
failure names each cycle with the ``file:line`` of every import in it.
"""

from __future__ import annotations

import ast
from collections import deque
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from itertools import pairwise
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("serve_app", "deployments")

FOUNDATIONS = ("auth", "limits", "billing", "storage", "catalog")
ABOVE_FOUNDATIONS = (
    "routes",
    "ingress",
    "requests",
    "inference",
    "jobs",
    "files",
    "batches",
    "tools",
    "dedicated",
    "heads",
    "composition",
    "builders",
    "cli",
    "config",
)
MAY_IMPORT_HEADS = ("composition", "builders", "cli")
"""The gateway modules that build heads or their cores (or bind their deployments)."""
ABOVE_HEAD_CLIENTS = tuple(
    f"serve_app.{p}"
    for p in (
        "routes",
        "ingress",
        "requests",
        "inference",
        "jobs",
        "files",
        "batches",
        "tools",
        "dedicated",
        *MAY_IMPORT_HEADS,
    )
)


def _within(module: str, *packages: str) -> bool:
    """Whether ``module`` is one of ``packages`` or inside one of them."""
    return any(module == p or module.startswith(f"{p}.") for p in packages)


@dataclass(frozen=True)
class Rule:
    name: str
    applies_to: Callable[[str], bool]
    """Takes the importing module's dotted name."""
    forbids: Callable[[str], bool]
    """Takes the imported dotted name (``from a import b`` is ``a.b``)."""


RULES = (
    Rule(
        "deployments reach the gateway only through serve_app.contract",
        lambda src: _within(src, "deployments"),
        lambda dst: _within(dst, "serve_app") and not _within(dst, "serve_app.contract"),
    ),
    Rule(
        "serve_app.contract imports neither the rest of serve_app nor deployments",
        lambda src: _within(src, "serve_app.contract"),
        lambda dst: (
            _within(dst, "deployments")
            or (_within(dst, "serve_app") and not _within(dst, "serve_app.contract"))
        ),
    ),
    Rule(
        "only the composition root, builders and cli import deployments",
        lambda src: (
            _within(src, "serve_app")
            and not _within(src, *(f"serve_app.{p}" for p in MAY_IMPORT_HEADS))
        ),
        lambda dst: _within(dst, "deployments"),
    ),
    Rule(
        "the head clients (serve_app.heads) import no service, route, ingress or root",
        lambda src: _within(src, "serve_app.heads"),
        lambda dst: _within(dst, *ABOVE_HEAD_CLIENTS),
    ),
    Rule(
        "foundations (auth, limits, billing, storage, catalog) import no upper layer or head",
        lambda src: _within(src, *(f"serve_app.{p}" for p in FOUNDATIONS)),
        lambda dst: _within(dst, "deployments", *(f"serve_app.{p}" for p in ABOVE_FOUNDATIONS)),
    ),
    Rule(
        "only the ingress imports serve_app.routes",
        lambda src: not _within(src, "serve_app.routes", "serve_app.ingress"),
        lambda dst: _within(dst, "serve_app.routes"),
    ),
    Rule(
        "only the Serve builder imports the app assembly (serve_app.ingress)",
        lambda src: not _within(src, "serve_app.ingress", "serve_app.builders"),
        lambda dst: _within(dst, "serve_app.ingress"),
    ),
    Rule(
        "serve_app.requests sits below the routes: it imports no route",
        lambda src: _within(src, "serve_app.requests"),
        lambda dst: _within(dst, "serve_app.routes"),
    ),
    Rule(
        "the wire types (serve_app.protocol) import only themselves and the contract",
        lambda src: _within(src, "serve_app.protocol"),
        lambda dst: (
            _within(dst, "deployments", "serve_app")
            and not _within(dst, "serve_app.protocol", "serve_app.contract")
        ),
    ),
    Rule(
        "tool backends and the outbound guard import no service or config (the loop is one)",
        lambda src: _within(src, "serve_app.tools", "serve_app.outbound"),
        lambda dst: _within(
            dst,
            *(f"serve_app.{p}" for p in ("inference", "jobs", "dedicated", "requests", "config")),
        ),
    ),
    Rule(
        "services and tools import nothing from the HTTP layers (ingress, requests)",
        lambda src: _within(
            src, "serve_app.inference", "serve_app.tools", "serve_app.files", "serve_app.batches"
        ),
        lambda dst: _within(dst, "serve_app.ingress", "serve_app.requests"),
    ),
    Rule(
        "services return answers, the routes make them HTTP: no fastapi or starlette below",
        lambda src: _within(
            src,
            *(f"serve_app.{p}" for p in ("inference", "batches", "files", "adapters", "protocol")),
        ),
        lambda dst: _within(dst, "fastapi", "starlette"),
    ),
)


def module_name(path: Path, root: Path) -> str:
    parts = list(path.relative_to(root).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def imported_names(tree: ast.AST, module: str, is_package: bool) -> Iterator[tuple[int, str]]:
    """``(line, dotted name)`` of every import in ``tree``, wherever it sits."""
    package = module if is_package else module.rpartition(".")[0]
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield node.lineno, alias.name
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                base = ".".join([*anchor, base] if base else anchor)
            for alias in node.names:
                if alias.name == "*":
                    yield node.lineno, base
                else:
                    yield node.lineno, f"{base}.{alias.name}" if base else alias.name
        elif (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute | ast.Name)
            and (node.func.attr if isinstance(node.func, ast.Attribute) else node.func.id)
            in ("import_module", "__import__")
            and node.args
            and isinstance(node.args[0], ast.Constant)
            and isinstance(node.args[0].value, str)
        ):
            yield node.lineno, node.args[0].value


def violations(root: Path) -> list[str]:
    """``file:line: rule: imported name`` for every import that breaks a rule under ``root``."""
    found: list[str] = []
    for package in PACKAGES:
        for path in sorted((root / package).rglob("*.py")):
            module = module_name(path, root)
            rules = [rule for rule in RULES if rule.applies_to(module)]
            if not rules:
                continue
            tree = ast.parse(path.read_text(), filename=str(path))
            is_package = path.name == "__init__.py"
            for line, name in imported_names(tree, module, is_package):
                for rule in rules:
                    if rule.forbids(name):
                        found.append(f"{path.relative_to(root)}:{line}: {rule.name}: {name}")
    return found


def test_imports_point_one_way() -> None:
    assert (REPO_ROOT / "deployments" / "video" / "head.py").is_file()  # the real tree is scanned
    found = violations(REPO_ROOT)
    assert not found, "imports against the layering:\n" + "\n".join(found)


def module_files(root: Path) -> dict[str, Path]:
    """Dotted module name -> file, for every module of ``PACKAGES`` under ``root``."""
    return {
        module_name(path, root): path
        for package in PACKAGES
        for path in sorted((root / package).rglob("*.py"))
    }


def import_graph(root: Path) -> dict[str, dict[str, int]]:
    """Module -> {module of the tree it imports: line of the first such import}.

    ``from a.b import c`` counts as an import of ``a.b.c`` where that is a module of the
    tree, else of ``a.b`` (``c`` is a name defined there); names outside the tree
    (the standard library, third parties) are left out.
    """
    files = module_files(root)

    def in_tree(name: str) -> str | None:
        while name and name not in files:
            name = name.rpartition(".")[0]
        return name or None

    graph: dict[str, dict[str, int]] = {}
    for module, path in files.items():
        tree = ast.parse(path.read_text(), filename=str(path))
        edges = graph.setdefault(module, {})
        for line, name in imported_names(tree, module, path.name == "__init__.py"):
            target = in_tree(name)
            if target is not None and target != module:
                edges.setdefault(target, line)
    return graph


def _strongly_connected(graph: dict[str, dict[str, int]]) -> list[list[str]]:
    """Tarjan's components of more than one module (iterative: no recursion limit)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    for start in sorted(graph):
        if start in index:
            continue
        work = [(start, iter(sorted(graph[start])))]
        index[start] = low[start] = len(index)
        stack.append(start)
        on_stack.add(start)
        while work:
            node, targets = work[-1]
            target = next(targets, None)
            if target is not None:
                if target not in index:
                    index[target] = low[target] = len(index)
                    stack.append(target)
                    on_stack.add(target)
                    work.append((target, iter(sorted(graph.get(target, {})))))
                elif target in on_stack:
                    low[node] = min(low[node], index[target])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    found.append(sorted(component))
    return found


def _shortest_cycle(graph: dict[str, dict[str, int]], members: list[str]) -> list[str]:
    """The shortest way from the component's first module back to itself, inside it."""
    start, inside = members[0], set(members)
    came_from: dict[str, str] = {}
    queue = deque([start])
    while queue:
        node = queue.popleft()
        for target in sorted(graph[node]):
            if target == start:
                path = [node]
                while path[-1] != start:
                    path.append(came_from[path[-1]])
                return [*reversed(path), start]
            if target in inside and target not in came_from:
                came_from[target] = node
                queue.append(target)
    raise AssertionError(f"{members} is not a strongly connected component")


def import_cycles(root: Path) -> list[str]:
    """One line per cycle: each import on it as ``module (file:line) -> imported module``."""
    graph = import_graph(root)
    files = module_files(root)
    described = []
    for members in _strongly_connected(graph):
        cycle = _shortest_cycle(graph, members)
        steps = [
            f"{src} ({files[src].relative_to(root)}:{graph[src][dst]})"
            for src, dst in pairwise(cycle)
        ]
        line = " -> ".join([*steps, cycle[-1]])
        if len(members) > len(cycle) - 1:
            line += f" [all entangled: {', '.join(members)}]"
        described.append(line)
    return described


def test_no_import_cycles() -> None:
    assert len(module_files(REPO_ROOT)) > 100  # the real tree is scanned
    cycles = import_cycles(REPO_ROOT)
    assert not cycles, "import cycles (break each: move what both need below both):\n" + (
        "\n".join(cycles)
    )


CYCLIC = {
    "serve_app/__init__.py": "",
    "serve_app/cli/__init__.py": "from serve_app.cli import check\n",
    "serve_app/cli/check.py": "from serve_app.cli.serve import load\n",
    "serve_app/cli/serve.py": "def f():\n    from .check import run\n",
    "deployments/__init__.py": "",
    "deployments/prep.py": "import json\n\n\ndef g():\n    import deployments.tiny_a\n",
    "deployments/tiny_a.py": "from deployments import tiny_b\n",
    "deployments/tiny_b.py": "from deployments.prep import build\n",
}
ACYCLIC = {
    "serve_app/__init__.py": "",
    "serve_app/cli/__init__.py": "from serve_app.cli.check import run\n",
    "serve_app/cli/check.py": "from serve_app.cli.config import load\nimport serve_app\n",
    "serve_app/cli/serve.py": "from serve_app.cli import check, config\nimport os\n",
    "serve_app/cli/config.py": "import yaml\n",
    "deployments/__init__.py": "",
    "deployments/prep.py": "from deployments.tiny import build\n",
    "deployments/tiny.py": "import importlib\nimportlib.import_module('json')\n",
}


@pytest.mark.parametrize(
    "files, expected",
    [
        pytest.param(
            CYCLIC,
            [
                "deployments.prep (deployments/prep.py:5) -> deployments.tiny_a "
                "(deployments/tiny_a.py:1) -> deployments.tiny_b (deployments/tiny_b.py:1) "
                "-> deployments.prep",
                "serve_app.cli.check (serve_app/cli/check.py:1) -> serve_app.cli.serve "
                "(serve_app/cli/serve.py:2) -> serve_app.cli.check",
            ],
            id="function-level, relative and three-module cycles",
        ),
        pytest.param(ACYCLIC, [], id="a package importing its modules, no way back"),
    ],
)
def test_the_checker_names_each_cycle_with_its_imports(
    tmp_path: Path, files: dict[str, str], expected: list[str]
) -> None:
    for name, text in files.items():
        path = tmp_path / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    assert sorted(import_cycles(tmp_path)) == expected


UPWARD = {
    "deployments/head.py": "def f():\n    from serve_app.jobs.store import JobStore\n",
    "deployments/chat/x.py": "import serve_app.settings\n",
    "deployments/chat/y.py": "from serve_app import settings\n",
    "deployments/chat/z.py": "import importlib\nimportlib.import_module('serve_app.storage')\n",
    "serve_app/contract/a.py": "from typing import TYPE_CHECKING\n"
    "if TYPE_CHECKING:\n    from deployments.chat.base import TextEngine\n",
    "serve_app/contract/b.py": "from ..settings import get_settings\n",
    "serve_app/protocol/c.py": "from deployments.video import base\n",
    "serve_app/billing/d.py": "from serve_app.inference.metering import MeteredRequest\n",
    "serve_app/storage/__init__.py": "from . import x\nfrom ..routes import chat\n",
    "serve_app/inference/e.py": "from serve_app.routes.chat import router\n",
    "serve_app/heads/f.py": "def f():\n    from deployments.chat.head import ChatHeadCore\n",
    "serve_app/dedicated/g.py": "from deployments.dedicated_head import DedicatedHead\n",
    "serve_app/ingress/h.py": "import deployments.replica_logging\n",
    "serve_app/heads/i.py": "from serve_app.inference.metering import Metering\n",
    "serve_app/inference/j.py": "from serve_app.requests.deps import caller\n",
    "serve_app/tools/k.py": "def f():\n    import serve_app.ingress\n",
    "serve_app/tools/l.py": "from serve_app.inference.metering import MeteredRequest\n",
    "serve_app/outbound/m.py": "from ..inference import images\n",
    "serve_app/inference/chat/n.py": "from fastapi.responses import JSONResponse\n",
    "serve_app/batches/o.py": "def f():\n    import starlette.responses\n",
    "serve_app/routes/p.py": "from serve_app.ingress.app import create_app\n",
    "serve_app/requests/q.py": "from serve_app.routes.chat import router\n",
    "serve_app/protocol/r.py": "from serve_app.dedicated.alias import SLUG_PATTERN\n",
    "serve_app/tools/s.py": "def f():\n    from serve_app.config import REPO_ROOT\n",
    "serve_app/composition.py": "from serve_app.ingress.replays import build_replay_store\n",
}
ALLOWED = {
    "deployments/ok.py": "from serve_app.contract.chat import TextDelta\n"
    "from serve_app import contract\nimport serve_app.contract.errors\n",
    "serve_app/contract/ok.py": "from serve_app.contract.errors import HeadFailure\n"
    "from .errors import GatewayError\nimport pydantic\n",
    "serve_app/routes/ok.py": "from serve_app.inference.metering import MeteredRequest\n"
    "from fastapi.responses import Response\nfrom serve_app.inference.answers import Body\n"
    "from serve_app.requests.deps import InferenceCaller, State\n",
    "serve_app/ingress/ok.py": "from serve_app.routes import chat\n"
    "from serve_app.inference.streams import MeteredStream\n"
    "from serve_app.requests.openapi import install_openapi\n",
    "serve_app/requests/ok.py": "from serve_app.inference.chat.service import TextService\n"
    "from fastapi import Depends\n",
    "serve_app/protocol/ok.py": "from serve_app.protocol.common import WholeInt\n"
    "from serve_app.contract.audio import sniff_container\nimport pydantic\n",
    "serve_app/inference/ok.py": "from serve_app.tools.runners import ToolBox\n"
    "from serve_app.outbound import safe_get\n",
    "serve_app/tools/ok.py": "from serve_app.outbound import AddressGuard\n"
    "from serve_app.contract.chat import ToolCallDelta\n",
    "serve_app/billing/ok.py": "from serve_app.storage.db import Database\n"
    "from serve_app.catalog.config import PricingConfig\n",
    "serve_app/composition.py": "from deployments.sandbox.bwrap import BwrapSandbox\n"
    "from serve_app.heads.client import RayHeadClient\n",
    "serve_app/builders.py": "from deployments.chat.head import ChatHead\n",
    "serve_app/cli/ok.py": "from deployments.local_models.prepared_models import ensure_model\n",
    "serve_app/heads/ok.py": "from serve_app.contract.chat import HeadEvent\n"
    "from serve_app.catalog.config import CatalogModel\n",
    "serve_app/dedicated/ok.py": "from serve_app.heads.client import HeadClient\n"
    "from serve_app.protocol.dedicated import SLUG_PATTERN\n",
}


@pytest.mark.parametrize(
    "files, expected",
    [
        pytest.param(
            UPWARD,
            [
                "deployments/chat/x.py:1",
                "deployments/chat/y.py:1",
                "deployments/chat/z.py:2",
                "deployments/head.py:2",
                "serve_app/batches/o.py:2",
                "serve_app/billing/d.py:1",
                "serve_app/composition.py:1",  # below the app assembly
                "serve_app/contract/a.py:3",
                "serve_app/contract/a.py:3",  # the contract, and not the root: two rules
                "serve_app/contract/b.py:1",
                "serve_app/dedicated/g.py:1",
                "serve_app/heads/f.py:2",
                "serve_app/heads/i.py:1",
                "serve_app/inference/chat/n.py:1",
                "serve_app/inference/e.py:1",
                "serve_app/inference/j.py:1",
                "serve_app/ingress/h.py:1",
                "serve_app/outbound/m.py:1",
                "serve_app/protocol/c.py:1",  # only the root imports heads,
                "serve_app/protocol/c.py:1",  # and the wire types import no head
                "serve_app/protocol/r.py:1",
                "serve_app/requests/q.py:1",  # only the ingress imports routes,
                "serve_app/requests/q.py:1",  # and the requests sit below them
                "serve_app/routes/p.py:1",
                "serve_app/storage/__init__.py:2",  # a foundation importing routes,
                "serve_app/storage/__init__.py:2",  # and a module besides the ingress
                "serve_app/tools/k.py:2",  # below the services,
                "serve_app/tools/k.py:2",  # and the ingress is HTTP only
                "serve_app/tools/l.py:1",
                "serve_app/tools/s.py:2",
            ],
            id="upward imports",
        ),
        pytest.param(ALLOWED, [], id="allowed imports"),
    ],
)
def test_the_checker_reports_each_upward_import_by_file_and_line(
    tmp_path: Path, files: dict[str, str], expected: list[str]
) -> None:
    for name, text in files.items():
        path = tmp_path / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    found = violations(tmp_path)
    assert sorted(v.split(": ")[0] for v in found) == expected, found
