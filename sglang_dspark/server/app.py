"""The FastAPI application around one engine (an EngineClient, engine/protocol.py). The caller
owns the engine's lifecycle."""

from __future__ import annotations

from fastapi import FastAPI

from sglang_dspark import __version__
from sglang_dspark.server import native_api, openai_api
from sglang_dspark.server.auth import ApiKeyMiddleware
from sglang_dspark.server.errors import install_error_handlers
from sglang_dspark.server.tools import check_parser


def create_app(engine, served_model_name: str | None = None, *, api_key: str | None = None,
               admin_api_key: str | None = None, tool_call_parser: str | None = None) -> FastAPI:
    """`served_model_name` is what clients pass as `model` (default: engine.model_name);
    `api_key` / `admin_api_key` and `tool_call_parser` work as SGLang's flags of the same names
    (server/auth.py, server/tools.py)."""
    app = FastAPI(title="DSpark server", version=__version__, docs_url=None, redoc_url=None)
    app.state.engine = engine
    app.state.served_model_name = served_model_name or engine.model_name
    app.state.tool_call_parser = check_parser(tool_call_parser) if tool_call_parser else None
    install_error_handlers(app)
    app.include_router(openai_api.router)
    app.include_router(native_api.router)
    if api_key or admin_api_key:
        app.add_middleware(ApiKeyMiddleware, api_key=api_key, admin_api_key=admin_api_key,
                           admin_paths=native_api.ADMIN_PATHS)
    return app
