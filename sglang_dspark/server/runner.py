"""Serve an app with uvicorn, announcing readiness only once the socket accepts connections."""

from __future__ import annotations

import uvicorn


class _Server(uvicorn.Server):
    def __init__(self, config: uvicorn.Config, ready_line: str):
        super().__init__(config)
        self._ready_line = ready_line

    async def startup(self, sockets=None) -> None:
        await super().startup(sockets)
        if self.started:  # scripts and supervisors wait for this line, not for the import to finish
            print(self._ready_line, flush=True)


def serve(engine, app, host: str, port: int, ready_line: str, log_level: str = "info") -> None:
    """Start the engine, serve until SIGINT/SIGTERM, then stop the engine."""
    config = uvicorn.Config(app, host=host, port=port, log_level=log_level, timeout_graceful_shutdown=5)
    engine.start()
    try:
        _Server(config, ready_line).run()
    finally:
        engine.shutdown()
