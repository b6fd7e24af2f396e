"""A toy language where target, draft and confidence are Markov chains over a small vocabulary,
so the exact target distribution of any continuation is known in closed form.

Confidences depend on the previously sampled token, like DSpark's Markov confidence head: the
setting in which a careless scheduler leaks a sample into its own acceptance decision.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from scipy import stats

ALPHA = 1e-3  # false-alarm rate of every losslessness test: P(reject | lossless) = 0.1 %


class MarkovWorld:
    def __init__(self, vocab: int, gamma: int, seed: int, conf: list[float] | None = None):
        g = torch.Generator().manual_seed(seed)
        mix = lambda: 0.5 * torch.distributions.Dirichlet(torch.ones(vocab)).sample((vocab,)) + 0.5 / vocab  # noqa: E731
        torch.manual_seed(seed)
        self.target = mix().double()  # target[prev] = p_t(. | prev)
        self.draft = mix().double()
        self.conf = torch.tensor(conf if conf else torch.rand(vocab, generator=g).tolist(), dtype=torch.float32)
        self.vocab, self.gamma = vocab, gamma

    def draft_block(self, last: torch.Tensor, g: torch.Generator):
        """Drafts [N, G], draft probs [N, G, V], target probs [N, G+1, V], conf [N, G]."""
        prev, tokens, q, conf = last, [], [], []
        for _ in range(self.gamma):
            dist = self.draft[prev]
            x = torch.multinomial(dist, 1, generator=g).squeeze(-1)
            tokens.append(x), q.append(dist), conf.append(self.conf[prev])
            prev = x
        tokens = torch.stack(tokens, 1)
        ctx = torch.cat([last.unsqueeze(1), tokens], 1)  # target row k is conditioned on ctx[:, k]
        return tokens, torch.stack(q, 1), self.target[ctx], torch.stack(conf, 1)


def joint_exact(world: MarkovWorld, first: int, length: int) -> torch.Tensor:
    """P_target(x_1..x_length | x_0 = first) over all vocab**length outcomes, x_1 most significant."""
    probs = world.target[first].clone()
    for _ in range(length - 1):
        last = torch.arange(probs.numel()) % world.vocab
        probs = (probs.unsqueeze(1) * world.target[last]).reshape(-1)
    return probs


def generate(
    world: MarkovWorld,
    *,
    trials: int,
    batch: int,
    length: int,
    plan: Callable[[int, torch.Tensor], torch.Tensor],
    verify: Callable,
    seed: int,
) -> torch.Tensor:
    """Run speculative rounds until every trial emitted `length` tokens; return outcome indices.

    `plan(step, conf [trials // batch, batch, G])` returns verify lens [trials]; each group of
    `batch` trials is one engine batch (the planners couple requests within a batch).
    """
    g = torch.Generator().manual_seed(seed)
    last = torch.zeros(trials, dtype=torch.int64)
    out = torch.zeros(trials, length, dtype=torch.int64)
    filled = torch.zeros(trials, dtype=torch.int64)
    for step in range(length):  # every round emits at least one token
        tokens, q, p, conf = world.draft_block(last, g)
        lens = plan(step, conf.view(-1, batch, world.gamma)).view(-1)
        n_acc, nxt = verify(tokens, q, p, lens, generator=g)
        emitted = torch.cat([tokens, torch.zeros_like(tokens[:, :1])], 1)
        emitted[torch.arange(trials), n_acc] = nxt
        for k in range(world.gamma + 1):
            take = (k <= n_acc) & (filled < length)
            out[take, filled[take]] = emitted[take, k]
            filled += take.to(torch.int64)
        last = emitted[torch.arange(trials), n_acc]
    index = torch.zeros(trials, dtype=torch.int64)
    for k in range(length):
        index = index * world.vocab + out[:, k]
    return index


def chi_square_pvalue(outcomes: torch.Tensor, expected_probs: torch.Tensor) -> float:
    counts = torch.bincount(outcomes, minlength=expected_probs.numel()).double()
    expected = expected_probs / expected_probs.sum() * counts.sum()
    return float(stats.chisquare(counts.numpy(), expected.numpy()).pvalue)
