"""Engine outputs into asyncio, and the rule that a request whose client has gone is aborted.

The engine calls back from its own thread; outputs cross into the event loop through
`call_soon_threadsafe`. Whoever stops reading a `RequestStream` before its final output closes it,
which aborts the request so its KV slot is freed at the next step instead of decoding for nobody.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Callable

import anyio
from starlette.requests import Request
from starlette.responses import StreamingResponse
from starlette.types import Receive, Scope, Send

from sglang_dspark.engine.sampling import SamplingParams
from sglang_dspark.server.errors import APIError


class RequestStream:
    """The outputs of one submitted request, in order; async-iterate until the final one."""

    def __init__(self, engine, prompt_ids: list[int], params: SamplingParams, request_id: str):
        self._engine = engine
        self._loop = asyncio.get_running_loop()
        self._queue: asyncio.Queue = asyncio.Queue()
        self.finished = False
        self.request_id = engine.submit(prompt_ids, params, self._on_output, request_id)

    def _on_output(self, output) -> None:  # engine thread
        try:
            self._loop.call_soon_threadsafe(self._queue.put_nowait, output)
        except RuntimeError:  # event loop already closed (server shutting down): nobody to tell
            pass

    def __aiter__(self) -> RequestStream:
        return self

    async def __anext__(self):
        if self.finished:
            raise StopAsyncIteration
        output = await self._queue.get()
        self.finished = output.finished
        return output

    def close(self) -> None:
        """Abort the request unless it already finished; idempotent."""
        if not self.finished:
            self.finished = True
            self._engine.abort(self.request_id)


async def _wait_disconnect(receive: Receive) -> None:
    while (await receive())["type"] != "http.disconnect":
        pass


async def collect_all(request: Request, streams: list[RequestStream]) -> list[list] | None:
    """All outputs of each non-streaming request, or None when the client left first (then all
    are aborted)."""
    results: list[list] = [[] for _ in streams]

    async def drain(i: int) -> None:
        async for output in streams[i]:
            results[i].append(output)

    try:
        async with anyio.create_task_group() as tg:
            async def watch() -> None:
                await _wait_disconnect(request.receive)
                tg.cancel_scope.cancel()

            tg.start_soon(watch)
            async with anyio.create_task_group() as drains:
                for i in range(len(streams)):
                    drains.start_soon(drain, i)
            tg.cancel_scope.cancel()
    finally:
        for stream in streams:
            stream.close()
    if not all(r and r[-1].finished for r in results):
        return None
    failed = next((r[-1].error for r in results if r[-1].error), None)
    if failed is not None:  # the engine ended it alone (engine/isolation.py): the other requests ran on
        raise APIError(500, failed, code="request_fault", type_="internal_error")
    return results


async def collect(request: Request, stream: RequestStream) -> list | None:
    """All outputs of one non-streaming request, or None when the client left first (then aborted)."""
    results = await collect_all(request, [stream])
    return None if results is None else results[0]


async def merged(streams: list[RequestStream]) -> AsyncIterator[tuple[int, object]]:
    """(stream index, output) of several streams in arrival order, until every one finished."""
    queue: asyncio.Queue = asyncio.Queue()

    async def pump(i: int) -> None:
        async for output in streams[i]:
            await queue.put((i, output))

    tasks = [asyncio.create_task(pump(i)) for i in range(len(streams))]
    try:
        remaining = len(streams)
        while remaining:
            i, output = await queue.get()
            remaining -= output.finished
            yield i, output
    finally:
        for task in tasks:
            task.cancel()


def error_event(out) -> str:
    """The SSE event that tells a streaming client the engine ended its request (engine/isolation.py),
    sent before the final chunk (whose finish_reason is "abort")."""
    return sse({"error": {"message": out.error, "type": "internal_error", "param": None, "code": "request_fault"}})


def sse(payload: dict | str) -> str:
    data = payload if isinstance(payload, str) else json.dumps(payload, ensure_ascii=False)
    return f"data: {data}\n\n"


class EventStreamResponse(StreamingResponse):
    """SSE response that notices a client leaving even while no token is due, and always closes
    its generator and calls `on_close`, so the request is aborted at once, not at garbage collection.

    Starlette only watches for disconnects on ASGI < 2.4 servers, and when it cancels the stream
    while a chunk is being sent the generator is left suspended, its cleanup never run.
    """

    media_type = "text/event-stream"

    def __init__(self, content: AsyncIterator[str], on_close: Callable[[], None]):
        super().__init__(content, headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})
        self._on_close = on_close

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            async with anyio.create_task_group() as tg:
                async def stream() -> None:
                    try:
                        await self.stream_response(send)
                    except OSError:  # the socket went away mid-send
                        pass
                    tg.cancel_scope.cancel()

                tg.start_soon(stream)
                await _wait_disconnect(receive)
                tg.cancel_scope.cancel()
        finally:
            await self.body_iterator.aclose()
            self._on_close()
