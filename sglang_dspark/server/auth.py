"""API keys with SGLang 0.5.23's semantics (`sglang/srt/utils/auth.py`), so a client or an operator
sees the same behaviour whichever engine serves.

- `--api-key K`: every endpoint needs `Authorization: Bearer K`.
- `--admin-api-key A`: admin endpoints (runtime knobs, cache flush) need A; with both keys set, the
  API key does not open them. With only an admin key, the rest stays open.
- `/health*` and `/metrics` are always open (probes and Prometheus carry no secrets).
- A refusal is 401 `{"error": "Unauthorized"}`. Keys are compared in constant time.
  (SGLang's 403 belongs to endpoints that demand an admin key even when none is configured; this
  server has none of those.)
"""

from __future__ import annotations

import enum
import secrets

from starlette.responses import JSONResponse
from starlette.types import ASGIApp, Receive, Scope, Send

OPEN_PREFIXES = ("/health", "/ready", "/metrics")


class AuthLevel(str, enum.Enum):
    NORMAL = "normal"
    ADMIN_OPTIONAL = "admin_optional"  # SGLang's level for set_internal_state, flush_cache


def _bearer_matches(header: str | None, expected: str) -> bool:
    scheme, _, token = (header or "").partition(" ")
    return scheme.lower() == "bearer" and bool(token) and secrets.compare_digest(token, expected)


def decide(*, method: str, path: str, authorization: str | None, api_key: str | None,
           admin_api_key: str | None, level: AuthLevel) -> bool:
    """Whether the request may proceed."""
    if method == "OPTIONS" or path.startswith(OPEN_PREFIXES):
        return True
    key = (admin_api_key or api_key) if level is AuthLevel.ADMIN_OPTIONAL else api_key
    return key is None or _bearer_matches(authorization, key)


class ApiKeyMiddleware:
    """Pure ASGI (a BaseHTTPMiddleware would hide client disconnects from streaming responses).
    `admin_paths`: the paths whose level is ADMIN_OPTIONAL."""

    def __init__(self, app: ASGIApp, *, api_key: str | None, admin_api_key: str | None, admin_paths: frozenset[str]):
        self.app, self.api_key, self.admin_api_key, self.admin_paths = app, api_key, admin_api_key, admin_paths

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            headers = dict(scope.get("headers") or [])
            authorization = headers.get(b"authorization")
            allowed = decide(method=scope["method"], path=scope["path"],
                            authorization=authorization.decode("latin-1") if authorization else None,
                            api_key=self.api_key, admin_api_key=self.admin_api_key,
                            level=AuthLevel.ADMIN_OPTIONAL if scope["path"] in self.admin_paths else AuthLevel.NORMAL)
            if not allowed:
                await JSONResponse({"error": "Unauthorized"}, status_code=401)(scope, receive, send)
                return
        await self.app(scope, receive, send)
