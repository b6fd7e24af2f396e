"""Serve an app with uvicorn on a free loopback port in a background thread (tests only)."""

from __future__ import annotations

import contextlib
import socket
import threading
import time

import uvicorn


@contextlib.contextmanager
def serve_on_loopback(app):
    """Yields the base URL; stops the server on exit."""
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning"))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    try:
        deadline = time.monotonic() + 20
        while not server.started and time.monotonic() < deadline and thread.is_alive():
            time.sleep(0.01)
        assert server.started, "the loopback server did not start within 20 s"
        yield f"http://127.0.0.1:{sock.getsockname()[1]}"
    finally:
        server.should_exit = True
        thread.join(10)


@contextlib.contextmanager
def dead_loopback_server():
    """Yields the URL of a loopback port that accepts connections and closes them at once,
    answering nothing: a dead server no other process can be listening on (unlike a fixed port
    such as 9)."""
    listener = socket.create_server(("127.0.0.1", 0))
    listener.settimeout(0.1)
    stop = threading.Event()

    def refuse() -> None:
        while not stop.is_set():
            try:
                conn, _ = listener.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            conn.close()

    thread = threading.Thread(target=refuse, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{listener.getsockname()[1]}"
    finally:
        stop.set()
        thread.join(5)
        listener.close()


@contextlib.contextmanager
def serve_engine_on_loopback(engine):
    """Run `engine` (an Engine) on its thread behind the HTTP app on a loopback port; yields
    (AsyncEngine, base URL) and shuts both down on exit."""
    from sglang_dspark.engine.async_engine import AsyncEngine
    from sglang_dspark.server import create_app

    client = AsyncEngine(engine)
    client.start()
    try:
        with serve_on_loopback(create_app(client)) as base:
            yield client, base
    finally:
        client.shutdown()
