"""Per-position samplers for the drafter's sequential stage.

A sampler maps step logits [R, V] (float32) and the block position k to (tokens int64 [R],
probs [R, V]) where probs is exactly the distribution the tokens were drawn from; rejection
sampling needs that distribution, not the raw softmax.
"""

from __future__ import annotations

from typing import Callable

import torch

Sampler = Callable[[torch.Tensor, int], tuple[torch.Tensor, torch.Tensor]]


def temperature_sampler(temperature: float = 1.0, generator: torch.Generator | None = None) -> Sampler:
    if temperature <= 0:
        raise ValueError("temperature must be > 0; use greedy_sampler for temperature 0")

    def sample(logits: torch.Tensor, k: int):
        probs = torch.softmax(logits.float() / temperature, dim=-1)
        return sample_from(probs, generator), probs

    return sample


def sample_from(probs: torch.Tensor, generator: torch.Generator | None = None) -> torch.Tensor:
    """One token per row of probs [R, V] by inverse CDF: ~10x faster than torch.multinomial on
    CPU at this vocab size. float64 cumsum keeps tiny probabilities exact; right-sided search
    never picks a zero-probability token."""
    cdf = probs.double().cumsum(dim=-1)
    u = torch.rand(probs.shape[0], 1, generator=generator, dtype=torch.float64, device=probs.device)
    tokens = torch.searchsorted(cdf, u * cdf[:, -1:], right=True)
    return tokens.squeeze(-1).clamp_(max=probs.shape[-1] - 1)


def greedy_sampler(logits: torch.Tensor, k: int):
    tokens = logits.argmax(dim=-1)
    probs = torch.zeros_like(logits, dtype=torch.float32)
    probs.scatter_(-1, tokens.unsqueeze(-1), 1.0)
    return tokens, probs
