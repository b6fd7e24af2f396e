"""A request's life inside the engine: tokens, KV positions, text, timing and outcome."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field

import torch

from sglang_dspark.engine.sampling import SamplingParams


@dataclass
class RequestOutput:
    request_id: str
    token_ids: list[int]  # new tokens since the previous output of this request
    text: str  # new text since the previous output (stop strings already cut)
    finished: bool
    finish_reason: str | None  # "stop" | "length" | "abort" | None
    prompt_tokens: int
    completion_tokens: int  # total so far


@dataclass
class Request:
    """State of one sequence. Invariant while decoding: the target's KV cache (and the drafter's
    context) hold positions < `kv_len`, and `tokens[kv_len]` is the pending anchor, the last token
    emitted and not yet run through the target."""

    id: str
    prompt_ids: list[int]
    params: SamplingParams
    callback: Callable[[RequestOutput], None]
    generator: torch.Generator | None
    slot: int = -1
    tokens: list[int] = field(default_factory=list)
    kv_len: int = 0  # prefill progress, then the KV length
    arrival: float = field(default_factory=time.perf_counter)
    first_token_at: float | None = None
    finished: bool = False
    finish_reason: str | None = None

    def __post_init__(self) -> None:
        self.tokens = list(self.prompt_ids)

    @property
    def num_prompt(self) -> int:
        return len(self.prompt_ids)

    @property
    def prefilling(self) -> bool:
        return self.kv_len < self.num_prompt

    @property
    def output_ids(self) -> list[int]:
        return self.tokens[self.num_prompt :]
