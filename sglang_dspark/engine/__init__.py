"""The reference engine: continuous batching with DSpark speculative decoding on PyTorch.

`Engine` (engine.py) steps synchronously; `AsyncEngine` (async_engine.py) runs it on a thread
behind the `EngineClient` protocol (protocol.py) that servers use; `build_engine` (factory.py)
loads one from model directories.
"""
