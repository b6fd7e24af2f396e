"""Read an OpenAI streaming response (server-sent events) into what a load-test record needs.

Pure: it is given each line with the clock reading taken when the line arrived, so tests feed it
synthetic timings and the Locust user feeds it `(time.perf_counter(), line)` as lines come in.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import dataclass, field


@dataclass
class StreamResult:
    chunk_s: list[float] = field(default_factory=list)  # arrival of each non-empty content chunk, s after send
    completion_tokens: int | None = None  # from the usage chunk (stream_options.include_usage)
    done: bool = False  # "data: [DONE]" arrived
    error: str | None = None  # an error event inside the stream
    bytes: int = 0


def _content(choice: dict) -> str:
    """Chat chunks carry `delta.content`, completion chunks `text`."""
    if "delta" in choice:
        return (choice["delta"] or {}).get("content") or ""
    return choice.get("text") or ""


def read_sse(timed_lines: Iterable[tuple[float, bytes]], t_send: float) -> StreamResult:
    result = StreamResult()
    for t, line in timed_lines:
        result.bytes += len(line) + 1
        if not line.startswith(b"data:"):
            continue  # blank separators, comments, "event:" lines
        data = line[5:].strip()
        if data == b"[DONE]":
            result.done = True
            break
        try:
            event = json.loads(data)
        except ValueError:
            result.error = f"unparsable event: {data[:120]!r}"
            break
        if event.get("error"):
            error = event["error"]
            result.error = str(error.get("message", error) if isinstance(error, dict) else error)
            break
        if any(_content(choice) for choice in event.get("choices") or ()):
            result.chunk_s.append(t - t_send)
        usage = event.get("usage")
        if usage and usage.get("completion_tokens") is not None:
            result.completion_tokens = int(usage["completion_tokens"])
    return result
