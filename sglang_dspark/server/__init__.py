"""HTTP front end of a DSpark engine: OpenAI-compatible and SGLang-native endpoints."""

from sglang_dspark.server.app import create_app
from sglang_dspark.server.runner import serve

__all__ = ["create_app", "serve"]
