"""The models cache a head finds on its own is the one the gateway's settings name.

Head replicas resolve ``prepared:``/``tiny:`` references through
``serve_app.contract.paths`` (``deployments`` may not import the gateway's
settings); the gateway and its CLI use ``GatewaySettings.resolved_models_dir``.
Both read the same variables, so every way of setting them must agree.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from deployments.local_models.model_prep import default_models_dir
from serve_app.contract.paths import DEFAULT_STATE_DIR, models_dir_from_environment
from serve_app.settings import GatewaySettings

CASES = {
    "neither": {},
    "models dir": {"GATEWAY_MODELS_DIR": "/srv/models"},
    "state dir": {"GATEWAY_STATE_DIR": "/srv/state"},
    "both": {"GATEWAY_MODELS_DIR": "/srv/models", "GATEWAY_STATE_DIR": "/srv/state"},
    "relative": {"GATEWAY_STATE_DIR": "state"},
    "lower case": {"gateway_models_dir": "/srv/lower"},
    "empty models dir": {"GATEWAY_MODELS_DIR": ""},
    "empty state dir": {"GATEWAY_STATE_DIR": ""},
}


@pytest.mark.parametrize("env", CASES.values(), ids=CASES.keys())
def test_heads_and_gateway_find_the_same_models_dir(
    env: dict[str, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    for name in ("GATEWAY_MODELS_DIR", "GATEWAY_STATE_DIR"):
        monkeypatch.delenv(name, raising=False)
        monkeypatch.delenv(name.lower(), raising=False)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    expected = GatewaySettings().resolved_models_dir()
    assert models_dir_from_environment() == expected
    assert default_models_dir() == expected  # what a head replica uses


def test_the_defaults_are_the_settings_defaults() -> None:
    assert GatewaySettings.model_fields["state_dir"].default == DEFAULT_STATE_DIR
    assert models_dir_from_environment({}) == DEFAULT_STATE_DIR / "models"
    assert models_dir_from_environment({"GATEWAY_STATE_DIR": "/x"}) == Path("/x/models")
