"""Which requests run this step: the waiting queue, the KV slots, admission and prefill chunks.

A request waits in arrival order until a KV slot is free and the admission rule (SLA mode's, see
engine/policy.py) lets it in. While its prompt is not fully in the KV cache it prefills, at most
`prefill_chunk` prompt tokens per step over all prefilling requests, each prompt cut at multiples of
`prefill_chunk`; then it decodes.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

from sglang_dspark.engine.request import Request


@dataclass(frozen=True)
class PrefillChunk:
    request: Request
    start: int  # first prompt position of the chunk (the request's KV length)
    tokens: list[int]


@dataclass
class ScheduledBatch:
    prefill: list[PrefillChunk] = field(default_factory=list)
    decode: list[Request] = field(default_factory=list)

    @property
    def empty(self) -> bool:
        return not self.prefill and not self.decode


class Scheduler:
    def __init__(self, max_running: int, prefill_chunk: int):
        self.prefill_chunk = prefill_chunk
        self.waiting: deque[Request] = deque()
        self.running: list[Request] = []
        self._free_slots = list(range(max_running))[::-1]  # pop() hands out slot 0 first

    @property
    def idle(self) -> bool:
        return not self.waiting and not self.running

    @property
    def has_free_slot(self) -> bool:
        return bool(self._free_slots)

    def __contains__(self, request_id: str) -> bool:
        return any(r.id == request_id for r in (*self.waiting, *self.running))

    def add(self, req: Request) -> None:
        self.waiting.append(req)

    def remove(self, request_id: str) -> Request | None:
        """Take a request out of the queue or the batch (its slot is freed); None if unknown."""
        for req in self.waiting:
            if req.id == request_id:
                self.waiting.remove(req)
                return req
        for req in self.running:
            if req.id == request_id:
                self.finish(req)
                return req
        return None

    def finish(self, req: Request) -> None:
        self.running.remove(req)
        self._free_slots.append(req.slot)

    def schedule(self, admits: Callable[[list[Request]], bool]) -> ScheduledBatch:
        """Admit waiting requests while slots are free and `admits(running)` agrees, then split the
        batch into prefill chunks (within the token budget) and decoding requests."""
        while self.waiting and self._free_slots and admits(self.running):
            req = self.waiting.popleft()
            req.slot = self._free_slots.pop()
            self.running.append(req)
        batch, budget = ScheduledBatch(), self.prefill_chunk
        for req in self.running:
            if not req.prefilling:
                batch.decode.append(req)
                continue
            # A prompt is cut at fixed positions, multiples of prefill_chunk, whatever else arrives:
            # its chunks, and so its bits, are the same alone and in a burst (a chunk that does not
            # fit this step's budget waits for the next, whole).
            end = min(req.num_prompt, (req.kv_len // self.prefill_chunk + 1) * self.prefill_chunk)
            if end - req.kv_len <= budget:
                batch.prefill.append(PrefillChunk(req, req.kv_len, req.prompt_ids[req.kv_len : end]))
                budget -= end - req.kv_len
        return batch
