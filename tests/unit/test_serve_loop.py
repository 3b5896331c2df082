"""Which replicas run on Ray Serve's own event loop (``serve_app.serve_loop``, issue 14).

The gateway and the chat heads are async throughout and skip Serve's user-code
thread; the heads that call torch in-process keep it. An operator's explicit
setting wins, and the rest of a deployment's runtime_env is kept.
"""

from __future__ import annotations

from typing import Any

import yaml

from serve_app.builders import build_gateway_app, head_application
from serve_app.config import REPO_ROOT, GatewayAppArgs
from serve_app.serve_loop import USER_CODE_THREAD_ENV, on_serve_loop


def _env_vars(actor_options: dict[str, Any] | None) -> dict[str, str]:
    return dict(((actor_options or {}).get("runtime_env") or {}).get("env_vars") or {})


def _local_args() -> dict[str, Any]:
    config = yaml.safe_load((REPO_ROOT / "configs" / "local.yaml").read_text())
    (app,) = [a for a in config["applications"] if a["name"] == "gateway"]
    args: dict[str, Any] = app["args"]
    return args


def test_on_serve_loop_sets_the_variable_and_keeps_the_rest() -> None:
    given = {"num_cpus": 1, "runtime_env": {"env_vars": {"A": "1"}, "pip": ["x"]}}
    options = on_serve_loop(given)
    assert options["num_cpus"] == 1
    assert options["runtime_env"]["pip"] == ["x"]
    assert _env_vars(options) == {"A": "1", USER_CODE_THREAD_ENV: "0"}
    assert _env_vars(given) == {"A": "1"}  # the caller's dict is not changed


def test_an_explicit_setting_wins() -> None:
    given = {"runtime_env": {"env_vars": {USER_CODE_THREAD_ENV: "1"}}}
    assert _env_vars(on_serve_loop(given))[USER_CODE_THREAD_ENV] == "1"


def test_chat_heads_and_the_gateway_run_on_serve_loop_other_heads_do_not() -> None:
    config = GatewayAppArgs.model_validate(_local_args())
    kinds: dict[str, set[str]] = {}
    for model in config.catalog:
        app = head_application(model)
        if app is None:
            continue
        options = app._bound_deployment.ray_actor_options
        kinds.setdefault(model.head, set()).add(_env_vars(options).get(USER_CODE_THREAD_ENV, ""))
    assert kinds["chat"] == {"0"}
    others = {head: values for head, values in kinds.items() if head != "chat"}
    assert others and all(values == {""} for values in others.values())
    gateway = build_gateway_app(_local_args())._bound_deployment.ray_actor_options
    assert _env_vars(gateway)[USER_CODE_THREAD_ENV] == "0"
