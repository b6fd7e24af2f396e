"""Per-request sampling parameters and their vectorised application to logits.

Rejection sampling is exact for any draft distribution, so the draft side uses the same
processing as the target side (temperature, top-k, top-p): the closer the two, the more drafts
survive. Greedy requests (temperature 0) take the argmax on both sides. A request's logit_bias is added to
the raw logits before all of that, on the target's side and the drafter's, so the output is
exactly the biased target's (OpenAI's semantics: bias, then sampling).

A seeded request draws the number for the token at each position from its seed and that position
(`core/sampling.keyed_uniforms`), and every categorical draw walks the vocabulary in token-id order, so
its draft and the target's own sample at a position are coupled: verification accepts a seeded draft
where it is the token the target samples there (engine/verification.py), and the output is the
target's own sample at every position, the same text whatever was drafted or batched beside it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import torch

from sglang_dspark.core.sampling import inverse_cdf, keyed_uniforms
from sglang_dspark.drafter.sampling import argmax_sampler


MAX_TOP_LOGPROBS = 20
MAX_LOGIT_BIAS = 100.0  # OpenAI's range is [-100, 100]; -100 bans a token in practice


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
    logit_bias: tuple[tuple[int, float], ...] = ()  # (token id, added to its logit), ids distinct
    prompt_logprobs: bool = False  # also the target's logprob of every prompt token (echo)
    # False keeps special tokens in the text (as SGLang does when tools are given: call markers
    # such as mistral's [TOOL_CALLS] are special tokens, and the call parser must see them)
    skip_special_tokens: bool = True
    grammar: object | None = field(default=None, compare=False, repr=False)  # xgrammar CompiledGrammar

    def __post_init__(self) -> None:
        if self.max_tokens < 1:
            raise ValueError(f"max_tokens: must be >= 1, got {self.max_tokens}")
        if not 0 <= self.temperature < math.inf:
            raise ValueError(f"temperature: must be finite and >= 0, got {self.temperature}")
        if not 0 < self.top_p <= 1:
            raise ValueError(f"top_p: must be in (0, 1], got {self.top_p}")
        if not 0 <= self.top_k < 2**63:  # 0: none; any k at or above the vocabulary is none too (probs)
            raise ValueError(f"top_k: must be >= 0 (0 or -1: no top-k), got {self.top_k}")
        if self.seed is not None and not 0 <= self.seed < 2**64:  # a 64-bit key (core/sampling.keyed_uniforms)
            raise ValueError(f"seed: must be in [0, 2**64), got {self.seed}")
        if not 0 <= self.top_logprobs <= MAX_TOP_LOGPROBS:
            raise ValueError(f"top_logprobs: must be in [0, {MAX_TOP_LOGPROBS}], got {self.top_logprobs}")
        ids = [t for t, _ in self.logit_bias]
        if len(set(ids)) != len(ids) or any(t < 0 for t in ids):
            raise ValueError("logit_bias: token ids must be distinct and >= 0")
        if any(not -MAX_LOGIT_BIAS <= b <= MAX_LOGIT_BIAS for _, b in self.logit_bias):
            raise ValueError(f"logit_bias: values must be in [{-MAX_LOGIT_BIAS:g}, {MAX_LOGIT_BIAS:g}]")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0


@dataclass
class SamplingBatch:
    """The sampling parameters of R requests as tensors, plus each request's random source.

    A row with a seed draws the number for the token at position n from (seed, n) alone, so its text
    depends on nothing else in the batch or the step; the others share the engine's generator.
    `anchor_pos` [R]: each row's anchor position, the token sampled at offset j being at anchor + 1 + j
    (every sampling call on a batch with seeded rows needs it).
    """

    temperature: torch.Tensor  # float32 [R]
    top_p: torch.Tensor  # float32 [R]
    top_k: torch.Tensor  # int64 [R]
    seeds: list[int | None]
    shared: torch.Generator = field(default_factory=torch.Generator)
    # logit_bias of all rows as (row, token id, value) columns; None when no row has one
    bias: tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None = None
    anchor_pos: list[int] | None = None

    @classmethod
    def build(cls, params: list[SamplingParams], shared: torch.Generator, anchor_pos: list[int] | None = None):
        return cls(
            temperature=torch.tensor([p.temperature for p in params], dtype=torch.float32),
            top_p=torch.tensor([p.top_p for p in params], dtype=torch.float32),
            top_k=torch.tensor([p.top_k for p in params], dtype=torch.int64),
            seeds=[p.seed for p in params],
            shared=shared,
            bias=_bias_columns(params),
            anchor_pos=anchor_pos,
        )

    def seeded_sampled(self) -> list[int]:
        """Rows sampled (not greedy) with a seed: verified against the target's own keyed sample."""
        return [i for i, seed in enumerate(self.seeds) if seed is not None and float(self.temperature[i]) > 0]

    def biased(self, logits: torch.Tensor, lens: torch.Tensor | None = None,
               vocab: torch.Tensor | None = None) -> torch.Tensor:
        """logits [R, ..., V] plus each row's logit_bias (a new tensor; the input when no row has
        one). With `lens`, logits are ragged [sum(1 + lens), V] (row r owns 1 + lens[r] of them).
        With `vocab` (a drafter's draft vocabulary: column j is token vocab[j]), biases of tokens
        outside it are dropped: the drafter cannot propose them anyway."""
        if self.bias is None:
            return logits
        rows, ids, vals = self.bias
        if vocab is not None:
            match = ids[:, None] == vocab.to(ids.device)[None, :]
            keep = match.any(-1)
            rows, ids, vals = rows[keep], match[keep].float().argmax(-1), vals[keep]
        out = logits.float().clone()
        if lens is not None:  # every logit row of request r gets request r's bias
            starts = torch.cumsum(1 + lens, 0) - (1 + lens)
            reps = (1 + lens)[rows]
            flat = torch.repeat_interleave(starts[rows], reps) + _ranges(reps)
            out[flat, torch.repeat_interleave(ids, reps)] += torch.repeat_interleave(vals, reps)
            return out
        out[rows, ..., ids] += vals.view(-1, *(1,) * (logits.dim() - 2))
        return out

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
        if bool((self.top_k > 0).any()):  # a k at or above the row's vocabulary (a draft vocabulary's too) is no top-k
            k = torch.where(self.top_k > 0, self.top_k.clamp(max=logits.shape[-1]),
                            torch.full_like(self.top_k, logits.shape[-1]))
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

    def keyed(self, rows: list[int], offsets: range) -> torch.Tensor:
        """float64 uniforms [len(rows), len(offsets)] of seeded rows: for the tokens at anchor + 1 + j."""
        if self.anchor_pos is None:
            raise ValueError("a batch with seeded rows needs their anchor positions to sample")
        pairs = [(self.seeds[r], self.anchor_pos[r] + 1 + j) for r in rows for j in offsets]
        return keyed_uniforms([s for s, _ in pairs], [p for _, p in pairs]).view(len(rows), len(offsets))

    def uniform(self, offset: int = 0) -> torch.Tensor:
        """One uniform [0, 1) per row (float64 [R]) for the token at anchor + 1 + offset: a seeded row's
        keyed by its seed and that position, the others from the shared generator."""
        out = torch.rand(len(self.seeds), generator=self.shared, dtype=torch.float64)
        seeded = [i for i, seed in enumerate(self.seeds) if seed is not None]
        if seeded:
            out[seeded] = self.keyed(seeded, range(offset, offset + 1))[:, 0]
        return out

    def sample(self, probs: torch.Tensor, offset: int = 0, id_order: torch.Tensor | None = None) -> torch.Tensor:
        """One token per row of probs [R, V] (the token at anchor + 1 + offset). `id_order`: the columns
        in token-id order (argsort of a draft vocabulary's ids), walked so that a seeded draft is coupled
        to the target's own sample; the result is still a column index."""
        if id_order is None:
            return inverse_cdf(probs, self.uniform(offset))
        return id_order[inverse_cdf(probs[:, id_order], self.uniform(offset))]

    def draft_sampler(self, vocab: torch.Tensor | None = None):
        """The drafter's per-position sampler: (logits [R, V], k) -> (tokens [R], probs [R, V]);
        `vocab`: the drafter's draft vocabulary when its logits cover only that. A batch of greedy
        rows only takes the argmax: the very tokens `probs` + `sample` give greedy rows (a one-hot's
        inverse CDF is its argmax), without the softmax, random numbers and CDF each of the gamma
        positions would pay, and without their one-hots, which verifying an all-greedy batch
        (argmax against argmax) never reads."""
        if bool(self.greedy.all()):
            if self.bias is None:  # argmax_sampler itself: the drafter may run its whole greedy chain at once
                return argmax_sampler
            return lambda logits, k: argmax_sampler(self.biased(logits, vocab=vocab), k)

        id_order = None if vocab is None else torch.argsort(vocab)  # once a block, not once a position

        def sample(logits: torch.Tensor, k: int):
            probs = self.probs(self.biased(logits, vocab=vocab))
            return self.sample(probs, offset=k, id_order=id_order), probs

        return sample


def _bias_columns(params: list[SamplingParams]):
    entries = [(r, t, b) for r, p in enumerate(params) for t, b in p.logit_bias]
    if not entries:
        return None
    rows, ids, vals = zip(*entries)
    return torch.tensor(rows), torch.tensor(ids), torch.tensor(vals, dtype=torch.float32)


def _ranges(counts: torch.Tensor) -> torch.Tensor:
    """[0..c0), [0..c1), ... concatenated."""
    ends = torch.cumsum(counts, 0)
    return torch.arange(int(ends[-1])) - torch.repeat_interleave(ends - counts, counts)
