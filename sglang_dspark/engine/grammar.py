"""Grammar-constrained decoding with xgrammar, lossless under speculation.

A constrained request's distribution at every position is the target's, masked to the tokens its
grammar allows after the prefix and renormalised. Under speculation that must hold at every
verified position, so the matcher is advanced along the draft to mask each verify row (the state
after the accepted prefix plus the drafts before it) and rolled back afterwards; the drafter's
proposals are masked the same way while it drafts, so its drafts are legal and survive more often.
Only committed tokens advance the matcher for good.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import torch
import xgrammar as xgr

_BITS = torch.arange(32, dtype=torch.int32)
GRAMMAR_KINDS = ("json_object", "json_schema", "regex", "ebnf")


@dataclass(frozen=True)
class GrammarSpec:
    kind: str  # one of GRAMMAR_KINDS
    source: str = ""  # the schema (JSON text), the regex or the EBNF; empty for json_object

    def __post_init__(self) -> None:
        if self.kind not in GRAMMAR_KINDS:
            raise ValueError(f"grammar: kind must be one of {GRAMMAR_KINDS}, got {self.kind!r}")


class GrammarCompiler:
    """Compiles grammar specs for one tokenizer; compiled grammars are cached (xgrammar's own cache
    and an LRU over specs), since clients repeat the same schema."""

    def __init__(self, tokenizer_info: xgr.TokenizerInfo):
        self.info = tokenizer_info
        self._compiler = xgr.GrammarCompiler(tokenizer_info)
        self.compile = functools.lru_cache(maxsize=256)(self._compile)

    @classmethod
    def for_tokenizer(cls, tokenizer) -> GrammarCompiler:
        """For a transformers tokenizer (xgrammar reads its vocabulary and stop tokens)."""
        return cls(xgr.TokenizerInfo.from_huggingface(tokenizer))

    def _compile(self, spec: GrammarSpec) -> xgr.CompiledGrammar:
        try:
            if spec.kind == "json_object":  # OpenAI's json_object is an object, not any JSON value
                return self._compiler.compile_json_schema('{"type": "object"}')
            if spec.kind == "json_schema":  # compact: SmolLM2 given free whitespace pads a call until max_tokens
                return self._compiler.compile_json_schema(spec.source, any_whitespace=False)
            if spec.kind == "regex":
                return self._compiler.compile_regex(spec.source)
            return self._compiler.compile_grammar(spec.source)
        except Exception as exc:  # xgrammar raises RuntimeError / ValueError on a bad grammar
            raise ValueError(f"{spec.kind}: cannot compile: {exc}") from None


class GrammarState:
    """One request's matcher over a compiled grammar."""

    def __init__(self, compiled: xgr.CompiledGrammar, stop_ids: set[int], max_rollback: int):
        self.matcher = xgr.GrammarMatcher(compiled, max_rollback_tokens=max_rollback)
        # the tokenizer's vocabulary; masks are padded with False up to the model's logits
        vocab_size = compiled.tokenizer_info.vocab_size
        self.vocab_size, self.stop_ids = vocab_size, sorted(t for t in stop_ids if t < vocab_size)
        self._bitmask = xgr.allocate_token_bitmask(1, vocab_size)

    def mask(self) -> torch.Tensor:
        """bool [V]: the tokens legal now; the stop tokens alone after the end (a stop token was
        accepted) or where nothing is legal (a dead end)."""
        if self.matcher.is_terminated():
            legal = torch.zeros(self.vocab_size, dtype=torch.bool)
        else:
            self.matcher.fill_next_token_bitmask(self._bitmask, 0)
            legal = ((self._bitmask[0, :, None] >> _BITS) & 1).bool().flatten()[: self.vocab_size]
        if not bool(legal.any()):
            legal[self.stop_ids] = True
        return legal

    def accept(self, token: int) -> bool:
        return self.matcher.accept_token(int(token)) if not self.matcher.is_terminated() else False

    def masks_along(self, tokens: list[int]) -> torch.Tensor:
        """bool [len(tokens) + 1, V]: the mask before each token and after the last, advancing
        through them and rolling back; rows after an illegal token are the dead end's."""
        rows, accepted = [self.mask()], 0
        for t in tokens:
            if accepted == len(rows) - 1 and self.accept(t):
                accepted += 1
                rows.append(self.mask())
            else:  # never reached by a correct verification: the target gives the token probability 0
                rows.append(rows[-1])
        self.rollback(accepted)
        return torch.stack(rows)

    def rollback(self, n: int) -> None:
        if n:
            self.matcher.rollback(n)


def masked(logits: torch.Tensor, legal: torch.Tensor) -> torch.Tensor:
    """Illegal tokens' logits to -inf (legal [.., V] bool, padded with False to the logits' width)."""
    if legal.shape[-1] < logits.shape[-1]:
        legal = torch.nn.functional.pad(legal, (0, logits.shape[-1] - legal.shape[-1]), value=False)
    return logits.masked_fill(~legal, float("-inf"))


def constrain_rows(logits: torch.Tensor, states: list[GrammarState | None]) -> torch.Tensor:
    """logits [R, V], row r masked by states[r]'s grammar now (unconstrained rows as they are)."""
    if not any(states):
        return logits
    out = logits.clone()
    for r, state in enumerate(states):
        if state is not None:
            out[r] = masked(out[r], state.mask())
    return out


def constrain_ragged(logits: torch.Tensor, states: list[GrammarState | None], drafts: torch.Tensor | None,
                     lens: torch.Tensor) -> torch.Tensor:
    """Ragged verify logits [sum(1 + lens), V]: row k of request r masked by its grammar after the
    accepted prefix and drafts[r, :k]."""
    if not any(states):
        return logits
    out, row = logits.clone(), 0
    for r, state in enumerate(states):
        n = int(lens[r])
        if state is not None:
            along = drafts[r, :n].tolist() if n else []
            out[row : row + n + 1] = masked(out[row : row + n + 1], state.masks_along(along))
        row += n + 1
    return out


def grammar_draft_sampler(inner, states: list[GrammarState | None], vocab: torch.Tensor | None):
    """Wrap the drafter's per-position sampler so constrained rows draft legal tokens: position k
    is masked by the grammar after the drafts before it. `.rollback()` returns every matcher to
    the committed state once the block is drafted."""
    advanced = [0] * len(states)
    alive = [s is not None for s in states]

    def sample(logits: torch.Tensor, k: int):
        logits = logits.clone()
        for r, state in enumerate(states):
            if alive[r]:
                legal = state.mask()
                legal = legal[vocab.to(legal.device)] if vocab is not None else legal
                if bool(legal.any()):  # nothing legal in a draft vocabulary: leave it, verification rejects
                    logits[r] = masked(logits[r], legal)
        tokens, probs = inner(logits, k)
        for r, state in enumerate(states):
            if alive[r]:
                token = int(vocab[tokens[r]]) if vocab is not None else int(tokens[r])
                if state.accept(token):
                    advanced[r] += 1
                else:
                    alive[r] = False
        return tokens, probs

    def rollback() -> None:
        for r, state in enumerate(states):
            if state is not None:
                state.rollback(advanced[r])

    sample.rollback = rollback
    return sample
