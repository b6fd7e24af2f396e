"""A request's life inside the engine: tokens, KV positions, text, timing and outcome."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from sglang_dspark.engine.sampling import SamplingParams

FINISH_REASONS = ("stop", "length", "abort")


class ContextLengthError(ValueError):
    """A prompt plus its max_tokens does not fit the context (OpenAI's context_length_exceeded)."""


class EngineBusy(Exception):
    """The engine holds as many requests as it may (running + queued): retry later (HTTP 429)."""


@dataclass(frozen=True)
class TokenLogprob:
    """The target's log-probability of one emitted token, and its `top` most likely alternatives
    ((token id, logprob), most likely first), both from the target's own logits at that position."""

    token_id: int
    logprob: float
    top: tuple[tuple[int, float], ...] = ()


@dataclass
class RequestOutput:
    request_id: str
    token_ids: list[int]  # new tokens since the previous output of this request
    text: str  # new text since the previous output (stop strings already cut)
    finished: bool
    finish_reason: str | None  # one of FINISH_REASONS, or None while running
    prompt_tokens: int
    completion_tokens: int  # total so far
    logprobs: list[TokenLogprob] | None = None  # one per new token when the request asked for them
    # with prompt_logprobs, on the first output: prompt tokens 1.. (the first has no context)
    prompt_logprobs: list[TokenLogprob] | None = None
    error: str | None = None  # on a final output: why the engine ended this request (engine/isolation.py)


@dataclass
class Request:
    """State of one sequence. Invariant while decoding: the target's KV cache (and the drafter's
    context) hold positions < `kv_len`, and `tokens[kv_len]` is the pending anchor, the last token
    emitted and not yet run through the target."""

    id: str
    prompt_ids: list[int]
    params: SamplingParams
    callback: Callable[[RequestOutput], None]
    arrival: float  # engine clock
    slot: int = -1
    tokens: list[int] = field(default_factory=list)
    kv_len: int = 0  # prefill progress, then the KV length
    first_token_at: float | None = None
    finished: bool = False
    finish_reason: str | None = None
    no_draft: bool = False  # decode without speculation (the canary's replays)
    replay_of: str | None = None  # the canary: the request this one replays
    expected: list[int] | None = None  # the canary: what the replayed request emitted
    # the canary: at the replay's first token that differs from `expected`, how far the replay's own
    # logit for the original's token fell below its choice (engine/canary.py, near ties)
    divergence_margin: float | None = None
    ended_on_eos: bool = False  # finished by an EOS token (which output_ids leave out)
    expected_eos: bool = False  # the canary: the replayed request ended on EOS after `expected`
    prompt_logprobs: list[TokenLogprob] = field(default_factory=list)  # filled by prefill, sent once
    prompt_logprobs_sent: bool = False
    grammar: object | None = None  # engine.grammar.GrammarState of a constrained request

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

    def speed(self, now: float) -> float | None:
        """Tokens per second since the first token, (n - 1) / elapsed: the load tests' per-user
        speed. None before a second token."""
        n = len(self.output_ids)
        if self.first_token_at is None or n < 2 or now <= self.first_token_at:
            return None
        return (n - 1) / (now - self.first_token_at)
