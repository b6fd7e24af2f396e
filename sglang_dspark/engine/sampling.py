"""Per-request sampling parameters and their vectorised application to logits.

Rejection sampling is exact for any draft distribution, so the draft side uses the same
processing as the target side (temperature, top-k, top-p): the closer the two, the more drafts
survive. Greedy requests (temperature 0) take the argmax on both sides.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from sglang_dspark.core.sampling import inverse_cdf


MAX_TOP_LOGPROBS = 20


@dataclass(frozen=True)
class SamplingParams:
    max_tokens: int = 128
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0  # 0 = no top-k
    stop: tuple[str, ...] = ()
    seed: int | None = None
    ignore_eos: bool = False
    logprobs: bool = False  # return the target's logprob of every emitted token
    top_logprobs: int = 0  # and its this many most likely alternatives (OpenAI allows up to 20)

    def __post_init__(self) -> None:
        if self.max_tokens < 1:
            raise ValueError(f"max_tokens: must be >= 1, got {self.max_tokens}")
        if not self.temperature >= 0:
            raise ValueError(f"temperature: must be >= 0, got {self.temperature}")
        if not 0 < self.top_p <= 1:
            raise ValueError(f"top_p: must be in (0, 1], got {self.top_p}")
        if self.top_k < 0:
            raise ValueError(f"top_k: must be >= 0, got {self.top_k}")
        if self.seed is not None and not 0 <= self.seed < 2**64:  # what a torch.Generator takes
            raise ValueError(f"seed: must be in [0, 2**64), got {self.seed}")
        if not 0 <= self.top_logprobs <= MAX_TOP_LOGPROBS:
            raise ValueError(f"top_logprobs: must be in [0, {MAX_TOP_LOGPROBS}], got {self.top_logprobs}")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0


@dataclass
class SamplingBatch:
    """The sampling parameters of R requests as tensors, plus each request's random source.

    Rows with a seed draw from their own generator, so a seeded request's output does not depend
    on what else is in the batch; the others share the engine's generator.
    """

    temperature: torch.Tensor  # float32 [R]
    top_p: torch.Tensor  # float32 [R]
    top_k: torch.Tensor  # int64 [R]
    generators: list[torch.Generator | None]
    shared: torch.Generator = field(default_factory=torch.Generator)

    @classmethod
    def build(cls, params: list[SamplingParams], generators: list[torch.Generator | None], shared: torch.Generator):
        return cls(
            temperature=torch.tensor([p.temperature for p in params], dtype=torch.float32),
            top_p=torch.tensor([p.top_p for p in params], dtype=torch.float32),
            top_k=torch.tensor([p.top_k for p in params], dtype=torch.int64),
            generators=generators,
            shared=shared,
        )

    @property
    def greedy(self) -> torch.Tensor:
        return self.temperature == 0

    def probs(self, logits: torch.Tensor) -> torch.Tensor:
        """Processed distributions for logits [R, ..., V]: temperature, then top-k, then top-p.
        Greedy rows get a one-hot argmax."""
        shape = (-1,) + (1,) * (logits.dim() - 1)
        logits = logits.float()
        temp = self.temperature.view(shape)
        scaled = logits / torch.where(temp > 0, temp, torch.ones_like(temp))
        if bool((self.top_k > 0).any()):
            k = torch.where(self.top_k > 0, self.top_k, torch.full_like(self.top_k, logits.shape[-1]))
            kth = torch.topk(scaled, int(k.max()), dim=-1).values
            kth = kth.gather(-1, (k.view(shape) - 1).expand(*scaled.shape[:-1], 1))
            scaled = scaled.masked_fill(scaled < kth, float("-inf"))
        probs = torch.softmax(scaled, dim=-1)
        if bool((self.top_p < 1).any()):
            sorted_p, order = torch.sort(probs, dim=-1, descending=True)
            mass_before = torch.cumsum(sorted_p, dim=-1) - sorted_p
            drop = mass_before >= self.top_p.view(shape)  # keep the smallest prefix reaching top_p
            sorted_p = sorted_p.masked_fill(drop, 0.0)
            probs = torch.zeros_like(probs).scatter_(-1, order, sorted_p)
            probs = probs / probs.sum(-1, keepdim=True)
        onehot = torch.zeros_like(probs).scatter_(-1, logits.argmax(-1, keepdim=True), 1.0)
        return torch.where(self.greedy.view(shape), onehot, probs)

    def uniform(self, *trailing: int) -> torch.Tensor:
        """Uniform [0, 1) numbers [R, *trailing], each row from its own generator if it has one."""
        rows = len(self.generators)
        out = torch.rand((rows, *trailing), generator=self.shared)
        for r, gen in enumerate(self.generators):
            if gen is not None:
                out[r] = torch.rand(trailing, generator=gen)
        return out

    def sample(self, probs: torch.Tensor) -> torch.Tensor:
        """One token per row of probs [R, V], each row with its own random number."""
        return inverse_cdf(probs, self.uniform())

    def draft_sampler(self):
        """The drafter's per-position sampler: (logits [R, V], k) -> (tokens [R], probs [R, V])."""

        def sample(logits: torch.Tensor, k: int):
            probs = self.probs(logits)
            return self.sample(probs), probs

        return sample
