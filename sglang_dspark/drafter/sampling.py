"""Per-position samplers for the drafter's sequential stage.

A sampler maps step logits [R, V] (float32) and the block position k to (tokens int64 [R],
probs [R, V]) where probs is exactly the distribution the tokens were drawn from; rejection
sampling needs that distribution, not the raw softmax. `argmax_sampler` returns None for probs:
the tokens are argmaxes, for a verifier that compares argmaxes and reads no distribution.
"""

from __future__ import annotations

from typing import Callable

import torch

from sglang_dspark.core.sampling import sample

Sampler = Callable[[torch.Tensor, int], tuple[torch.Tensor, torch.Tensor | None]]


def temperature_sampler(temperature: float = 1.0, generator: torch.Generator | None = None) -> Sampler:
    if temperature <= 0:
        raise ValueError("temperature must be > 0; use greedy_sampler for temperature 0")

    def draw(logits: torch.Tensor, k: int):
        probs = torch.softmax(logits.float() / temperature, dim=-1)
        return sample(probs, generator), probs

    return draw


def greedy_sampler(logits: torch.Tensor, k: int):
    tokens = logits.argmax(dim=-1)
    probs = torch.zeros_like(logits, dtype=torch.float32)
    probs.scatter_(-1, tokens.unsqueeze(-1), 1.0)
    return tokens, probs


def argmax_sampler(logits: torch.Tensor, k: int):
    """Greedy tokens without their one-hot distributions: an all-greedy batch's verification
    compares argmaxes, so the gamma [R, V] one-hots (and their expansion to the full vocabulary)
    would be built and never read."""
    return logits.argmax(dim=-1), None


argmax_sampler.argmax_of_logits = True  # its tokens are the raw logits' argmax: `is_argmax`


def is_argmax(sampler: Sampler) -> bool:
    """Whether `sampler`'s tokens are exactly the argmax of the logits it is given, with no
    distribution reported: a backend may then draft every position at once. A sampler that changes
    the logits first (a bias, a grammar) is not, whatever it wraps."""
    return getattr(sampler, "argmax_of_logits", False) is True
