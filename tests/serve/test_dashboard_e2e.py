"""The dashboard's session API through Ray Serve (the gateway replica on its port): sign in,
make a key, use it with the openai SDK, revoke it, and the offline /docs."""

from __future__ import annotations

import httpx
import openai
import pytest

from serve_app.auth.sessions import SessionStore
from tests.serve.conftest import SMOLLM, ServeStack

PASSWORD = "e2e dashboard password"


def test_sign_in_make_use_and_revoke_a_key(serve_stack: ServeStack) -> None:
    SessionStore(serve_stack.store.database, serve_stack.store, ttl_s=600).set_password(
        "e2e-user", PASSWORD
    )
    with httpx.Client(base_url=serve_stack.base_url, timeout=60) as browser:
        session = browser.post("/api/session", json={"username": "e2e-user", "password": PASSWORD})
        assert session.status_code == 200, session.text
        browser.headers["X-CSRF-Token"] = session.json()["csrf_token"]
        created = browser.post("/api/keys", json={"name": "e2e", "scopes": ["inference"]})
        assert created.status_code == 201, created.text
        client = openai.OpenAI(
            base_url=f"{serve_stack.base_url}/v1", api_key=created.json()["key"], max_retries=0
        )
        reply = client.chat.completions.create(
            model=SMOLLM, messages=[{"role": "user", "content": "hi"}], max_tokens=4
        )
        assert reply.usage is not None and reply.usage.completion_tokens > 0
        revoked = browser.delete(f"/api/keys/{created.json()['id']}")
        assert revoked.status_code == 200
        with pytest.raises(openai.AuthenticationError):
            client.chat.completions.create(
                model=SMOLLM, messages=[{"role": "user", "content": "hi"}], max_tokens=4
            )
        assert browser.delete("/api/session").status_code == 204
        assert browser.get("/api/session").status_code == 401


def test_docs_are_served_from_the_gateway(serve_stack: ServeStack) -> None:
    with httpx.Client(base_url=serve_stack.base_url, timeout=60) as http:
        page = http.get("/docs")
        bundle = http.get("/docs/assets/swagger-ui-bundle.js")
    assert page.status_code == 200 and "/docs/assets/swagger-ui-bundle.js" in page.text
    assert "cdn." not in page.text
    assert bundle.status_code == 200 and len(bundle.content) > 100_000
