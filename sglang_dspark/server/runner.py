"""Serve an app with uvicorn: readiness announced once the socket accepts connections, and a drain
on SIGTERM / SIGINT.

Drain: the listener closes at once (new connections are refused, so a load balancer moves on);
requests already running get `drain_s` seconds to finish; whatever still runs then is ended by the
engine with finish_reason "abort", so every client gets a complete response (a final chunk and
`[DONE]` on a stream) rather than a cut connection. Then the engine stops and the process exits 0:
a completed drain is a clean exit (uvicorn would re-raise the signal and skip our engine shutdown).
"""

from __future__ import annotations

import asyncio
import contextlib

import uvicorn

READY_PREFIX = "DSpark server ready on"  # what scripts, supervisors and tests wait for
FLUSH_S = 5.0  # after the engine ends what still runs: time for those last responses to go out


class _Server(uvicorn.Server):
    def __init__(self, config: uvicorn.Config, ready_line: str, engine, drain_s: float):
        super().__init__(config)
        self._ready_line, self._engine, self._drain_s = ready_line, engine, drain_s

    async def startup(self, sockets=None) -> None:
        await super().startup(sockets)
        if self.started:  # scripts and supervisors wait for this line, not for the import to finish
            print(self._ready_line, flush=True)

    @contextlib.contextmanager
    def capture_signals(self):
        with super().capture_signals():
            try:
                yield
            finally:
                getattr(self, "_captured_signals", []).clear()  # drained: no re-raise, so serve() stops the engine

    async def shutdown(self, sockets=None) -> None:
        handle = asyncio.get_running_loop().call_later(self._drain_s, self._engine.abort_all)
        try:
            await super().shutdown(sockets)
        finally:
            handle.cancel()


def serve(engine, app, host: str, port: int, ready_line: str, log_level: str = "info", drain_s: float = 30.0) -> None:
    """Start the engine, serve until SIGINT/SIGTERM (then drain, see above), stop the engine."""
    config = uvicorn.Config(app, host=host, port=port, log_level=log_level,
                            timeout_graceful_shutdown=drain_s + FLUSH_S)
    engine.start()
    try:
        _Server(config, ready_line, engine, drain_s).run()
    finally:
        engine.shutdown()
