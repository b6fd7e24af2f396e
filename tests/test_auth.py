"""API keys as SGLang 0.5.23 has them: --api-key on everything but /health* and /metrics,
--admin-api-key on the admin endpoints; every refusal is 401 {"error": "Unauthorized"} and the
server keeps serving. The decision function agrees with SGLang's own on every combination."""

from __future__ import annotations

import itertools

import pytest
from fastapi.testclient import TestClient
from test_server import CHAT, FakeEngine

from sglang_dspark.server import create_app
from sglang_dspark.server.auth import AuthLevel, decide

UNAUTHORIZED = {"error": "Unauthorized"}
KNOB = {"server_args": {"dspark_force_budget_frac": 0.5}}


def _client(**keys) -> TestClient:
    return TestClient(create_app(FakeEngine(), **keys))


def _bearer(key: str) -> dict:
    return {"Authorization": f"Bearer {key}"}


def test_api_key_guards_every_endpoint_but_health_and_metrics():
    with _client(api_key="sk-user") as c:
        for headers in ({}, _bearer("wrong"), {"Authorization": "sk-user"}, {"Authorization": "Basic sk-user"}):
            r = c.post("/v1/chat/completions", json=CHAT, headers=headers)
            assert r.status_code == 401 and r.json() == UNAUTHORIZED, headers
        assert c.get("/v1/models").status_code == 401 and c.get("/server_info").status_code == 401
        for open_path in ("/health", "/health_generate", "/metrics"):
            assert c.get(open_path).status_code == 200, open_path
        ok = c.post("/v1/chat/completions", json=CHAT, headers=_bearer("sk-user"))
        assert ok.status_code == 200 and ok.json()["choices"][0]["message"]["content"]
        # without an admin key, the API key opens the admin endpoints too (SGLang's ADMIN_OPTIONAL)
        assert c.post("/set_internal_state", json=KNOB).status_code == 401
        assert c.post("/set_internal_state", json=KNOB, headers=_bearer("sk-user")).status_code == 200


def test_admin_key_takes_the_admin_endpoints_from_the_api_key():
    with _client(api_key="sk-user", admin_api_key="sk-admin") as c:
        for path, method in (("/set_internal_state", "post"), ("/flush_cache", "post"), ("/flush_cache", "get")):
            kwargs = {"json": KNOB} if path == "/set_internal_state" else {}
            refused = getattr(c, method)(path, headers=_bearer("sk-user"), **kwargs)
            assert refused.status_code == 401 and refused.json() == UNAUTHORIZED, (path, method)
            assert getattr(c, method)(path, headers=_bearer("sk-admin"), **kwargs).status_code == 200
        # the admin key is not an API key: normal endpoints still want the API key
        assert c.post("/v1/chat/completions", json=CHAT, headers=_bearer("sk-admin")).status_code == 401
        assert c.post("/v1/chat/completions", json=CHAT, headers=_bearer("sk-user")).status_code == 200


def test_admin_key_alone_leaves_the_api_open():
    with _client(admin_api_key="sk-admin") as c:
        assert c.post("/v1/chat/completions", json=CHAT).status_code == 200
        assert c.post("/set_internal_state", json=KNOB).status_code == 401
        assert c.post("/set_internal_state", json=KNOB, headers=_bearer("sk-admin")).status_code == 200


def test_no_keys_no_checks():
    with _client() as c:
        assert c.post("/set_internal_state", json=KNOB).status_code == 200
        assert c.post("/v1/chat/completions", json=CHAT).status_code == 200


@pytest.mark.sglang
def test_decisions_match_sglangs_own():
    from sglang.srt.utils.auth import AuthLevel as SgLevel
    from sglang.srt.utils.auth import decide_request_auth

    headers = (None, "Bearer k", "Bearer a", "bearer k", "Bearer wrong", "k", "Bearer ")
    keys = (None, "k")
    admin_keys = (None, "a")
    paths = ("/v1/chat/completions", "/health_generate", "/metrics", "/set_internal_state")
    for method, path, header, key, admin, level in itertools.product(
            ("GET", "POST", "OPTIONS"), paths, headers, keys, admin_keys, (AuthLevel.NORMAL, AuthLevel.ADMIN_OPTIONAL)):
        theirs = decide_request_auth(method=method, path=path, authorization_header=header, api_key=key,
                                     admin_api_key=admin, auth_level=SgLevel(level.value))
        ours = decide(method=method, path=path, authorization=header, api_key=key, admin_api_key=admin, level=level)
        assert ours == theirs.allowed, (method, path, header, key, admin, level)
