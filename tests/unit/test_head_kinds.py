"""The table of head kinds (``serve_app/contract/head_kinds.py``) against everything that
must agree with it: a kind registered on one side only fails here, naming what is missing.

Each check is one place a kind must be present: the catalog's ``HeadKind``, the backend
registry (at least one backend), the Serve deployment and the methods the gateway calls
on it, the engine contract the registry builds, the head client's methods and the field
its clients are filed under, the service package of its family, its route in the app,
and the price its billing unit reads. The half-registered tests then take a kind out of
one side (or add one to one side) and expect the check to fail.
"""

from __future__ import annotations

import dataclasses
import inspect
from typing import get_args

import pytest

from deployments import registry
from serve_app.catalog.config import CatalogModel, PricingConfig
from serve_app.config import REPO_ROOT
from serve_app.contract import head_kinds
from serve_app.contract.head_kinds import HEAD_KINDS, HeadKindSpec
from serve_app.heads.client import HeadClients, RayHeadClient
from tests.fixtures.gateway import GatewayHarness

NAMES = [spec.name for spec in HEAD_KINDS]
PRICE_OF_UNIT = {
    "token": "input_per_mtok",
    "audio_second": "per_audio_second",
    "image": "per_image",
    "video_second": "per_video_second",
}


def half_registered(
    specs: tuple[HeadKindSpec, ...],
    backend_kinds: set[str],
    client_fields: set[str],
) -> list[str]:
    """What is registered on one side only: a kind without a backend, a backend or a
    ``HeadClients`` field without a kind, a kind whose client field does not exist."""
    problems = []
    kinds = {spec.name for spec in specs}
    for spec in specs:
        if spec.name not in backend_kinds:
            problems.append(f"{spec.name}: no backend in deployments/registry.py")
        if spec.clients not in client_fields:
            problems.append(f"{spec.name}: HeadClients has no field {spec.clients!r}")
    for kind in sorted(backend_kinds - kinds):
        problems.append(f"{kind}: a backend in the registry, but no head kind in the table")
    for name in sorted(client_fields - {spec.clients for spec in specs}):
        problems.append(f"HeadClients.{name}: a client without a head kind (no deployment)")
    return problems


def _registry_kinds() -> set[str]:
    return {kind for kind, _ in registry.BACKENDS}


def _client_fields() -> set[str]:
    return {f.name for f in dataclasses.fields(HeadClients)}


def test_no_kind_is_half_registered() -> None:
    assert half_registered(HEAD_KINDS, _registry_kinds(), _client_fields()) == []


def test_a_kind_without_a_backend_is_caught() -> None:
    assert half_registered(HEAD_KINDS, _registry_kinds() - {"parse"}, _client_fields()) == [
        "parse: no backend in deployments/registry.py"
    ]


def test_a_backend_or_a_client_without_a_kind_is_caught() -> None:
    without_video = tuple(s for s in HEAD_KINDS if s.name != "video")
    assert half_registered(without_video, _registry_kinds(), _client_fields()) == [
        "video: a backend in the registry, but no head kind in the table",
        "HeadClients.video: a client without a head kind (no deployment)",
    ]


def test_the_catalog_and_the_registry_name_the_tables_kinds() -> None:
    assert sorted(get_args(head_kinds.HeadKind)) == sorted(NAMES)
    assert len(set(NAMES)) == len(NAMES)
    assert tuple(NAMES) == registry.HEAD_KINDS
    assert sorted(get_args(CatalogModel.model_fields["head"].annotation)) == sorted(NAMES)


@pytest.mark.parametrize("spec", HEAD_KINDS, ids=NAMES)
def test_each_kind_has_a_deployment_with_the_methods_its_client_calls(spec: HeadKindSpec) -> None:
    assert spec.deployment.startswith("deployments."), "heads live in deployments/"
    deployment = registry.load(spec.deployment)
    head_class = getattr(deployment, "func_or_class", deployment)  # a Serve Deployment
    assert inspect.isclass(head_class), spec.deployment
    for method in spec.head_methods:
        assert callable(getattr(head_class, method, None)), f"{spec.deployment} has no {method}"
    for method in spec.client_methods:
        assert callable(getattr(RayHeadClient, method, None)), f"RayHeadClient has no {method}"


@pytest.mark.parametrize("spec", HEAD_KINDS, ids=NAMES)
def test_each_kind_names_an_engine_contract_its_backends_implement(spec: HeadKindSpec) -> None:
    assert spec.engine.startswith("deployments.")
    base = registry.load(spec.engine)
    assert inspect.isclass(base) and inspect.isabstract(base), spec.engine
    for (kind, name), backend in registry.BACKENDS.items():
        if kind == spec.name:
            engine = registry.load(backend.engine)
            assert issubclass(engine, base), f"{kind}/{name}: {backend.engine} is not a {base}"


@pytest.mark.parametrize("spec", HEAD_KINDS, ids=NAMES)
def test_each_kind_has_its_family_service_price_and_contract_values(spec: HeadKindSpec) -> None:
    assert (REPO_ROOT / "serve_app" / "inference" / spec.family / "service.py").is_file()
    assert PRICE_OF_UNIT[spec.billing_unit] in PricingConfig.model_fields
    assert spec.requests, f"{spec.name}: what does the gateway ask of it?"
    for value_type in (*spec.requests, *spec.replies):
        assert value_type.__module__.startswith("serve_app.contract."), value_type
        assert dataclasses.is_dataclass(value_type), f"{value_type} crosses a handle as values"


def test_each_kinds_route_is_served_by_the_app(sync_gateway: GatewayHarness) -> None:
    paths = sync_gateway.app.openapi()["paths"]
    assert [spec.route for spec in HEAD_KINDS if spec.route not in paths] == []
