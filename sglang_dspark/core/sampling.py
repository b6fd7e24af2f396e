"""The one categorical sampler every path uses: drafts, verification residuals and bonus tokens,
and the engine's own next tokens. One numeric recipe means one set of statistical tests covers them.

Inverse CDF: far cheaper than torch.multinomial on a CPU at a large vocabulary, and it lets a caller
supply the uniforms: a seeded request's come from `keyed_uniforms`, one per (seed, position), so the
token at a position depends on the seed and the distribution there, not on how many numbers were
drawn before it (nor on what was drafted).
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


_MASK = (1 << 64) - 1


def _splitmix64(x: int) -> int:
    """SplitMix64's output function: a bijection of 64-bit integers whose outputs pass BigCrush."""
    x = (x + 0x9E3779B97F4A7C15) & _MASK
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & _MASK
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & _MASK
    return x ^ (x >> 31)


def keyed_uniforms(seeds: list[int], positions: list[int]) -> torch.Tensor:
    """float64 uniforms in [0, 1), one per (seed, position) pair: the 53 high bits of SplitMix64 over
    the seed's own stream, at the position. Independent across positions for a seed, and a pure
    function of the pair (counter-based, as JAX's and Philox's keyed streams are)."""
    out = [(_splitmix64(_splitmix64(seed & _MASK) ^ (pos & _MASK)) >> 11) * 2.0 ** -53
           for seed, pos in zip(seeds, positions)]
    return torch.tensor(out, dtype=torch.float64)
