"""The one categorical sampler every path uses: drafts, verification residuals and bonus tokens,
and the engine's own next tokens. One numeric recipe means one set of statistical tests covers them.

Inverse CDF: ~10x faster than torch.multinomial on a CPU at a 49K vocabulary, and it lets a caller
supply the uniforms (a seeded request draws from its own generator).
"""

from __future__ import annotations

import torch


def inverse_cdf(probs: torch.Tensor, uniforms: torch.Tensor) -> torch.Tensor:
    """One token per row of probs [R, V] (unnormalised is fine) for uniforms [R] in [0, 1).

    The cumulative sum runs in float64, so a tiny probability keeps its own slice of [0, 1), and
    the right-sided search never lands on a zero-probability token (not even for u = 0).
    """
    cdf = probs.double().cumsum(dim=-1)
    scaled = uniforms.to(cdf).reshape(-1, 1) * cdf[:, -1:]
    tokens = torch.searchsorted(cdf, scaled, right=True).squeeze(-1)
    return tokens.clamp_(max=probs.shape[-1] - 1)


def sample(probs: torch.Tensor, generator: torch.Generator | None = None) -> torch.Tensor:
    """`inverse_cdf` with uniforms drawn from `generator` (one per row)."""
    return inverse_cdf(probs, torch.rand(probs.shape[0], generator=generator, dtype=torch.float64, device=probs.device))
