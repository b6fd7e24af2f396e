"""The FastAPI application around one engine. The caller owns the engine's lifecycle."""

from __future__ import annotations

from fastapi import FastAPI

from sglang_dspark import __version__
from sglang_dspark.server import native_api, openai_api
from sglang_dspark.server.errors import install_error_handlers


def create_app(engine, served_model_name: str | None = None) -> FastAPI:
    """`served_model_name` is what clients pass as `model` (default: engine.model_name)."""
    app = FastAPI(title="DSpark server", version=__version__, docs_url=None, redoc_url=None)
    app.state.engine = engine
    app.state.served_model_name = served_model_name or engine.model_name
    install_error_handlers(app)
    app.include_router(openai_api.router)
    app.include_router(native_api.router)
    return app
