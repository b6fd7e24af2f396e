"""Tiny target + drafter + tokenizer for engine and server tests (built in about a second)."""

from __future__ import annotations

import torch
from transformers import LlamaConfig, LlamaForCausalLM

from sglang_dspark.drafter import DraftOutput, DSparkDraftConfig, DSparkDrafter
from sglang_dspark.engine.engine import Engine, EngineConfig
from sglang_dspark.engine.target_model import TargetModel

VOCAB = 48
EOS = 2


class ToyTokenizer:
    """Token i <-> the word "w{i}"; enough for detokenization, stop strings and chat prompts."""

    eos_token_id = EOS
    chat_template = "toy"

    def __len__(self):
        return VOCAB

    def decode(self, ids, skip_special_tokens=True):
        return "".join(f" w{i}" for i in ids if not (skip_special_tokens and i == EOS))

    def encode(self, text, add_special_tokens=False):
        return [int(w[1:]) % VOCAB for w in text.split() if w.startswith("w") and w[1:].isdigit()] or [5]

    def apply_chat_template(self, messages, add_generation_prompt=True, tokenize=False, **kwargs):
        text = " ".join(m["content"] for m in messages)
        return self.encode(text) if tokenize else text


def tiny_hf_target(seed: int = 0, peaky: float = 4.0) -> LlamaForCausalLM:
    torch.manual_seed(seed)
    config = LlamaConfig(
        vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=4, num_attention_heads=4,
        num_key_value_heads=2, head_dim=8, max_position_embeddings=512, tie_word_embeddings=False,
        eos_token_id=EOS, bos_token_id=1,
    )
    model = LlamaForCausalLM(config).eval()
    with torch.no_grad():  # sharper than random init, so greedy and sampling are both non-trivial
        model.lm_head.weight.mul_(peaky)
    return model


def tiny_drafter_for(target: TargetModel, seed: int = 1, gamma: int = 4) -> DSparkDrafter:
    torch.manual_seed(seed)
    cfg = DSparkDraftConfig.from_target_config(
        target.config.to_dict(), target_layer_ids=[0, 2], mask_token_id=3, num_hidden_layers=1,
        block_size=gamma, markov_rank=8, markov_head_type="vanilla", enable_confidence_head=True,
    )
    drafter = DSparkDrafter(cfg, target.embed_tokens, target.lm_head).to(target.dtype).eval()
    if target.weight_format != "float32":  # as engine/factory.py does (float32's layouts: test_weight_layout.py)
        target.fmt.prepare_drafter(drafter)  # int8, int4: the drafter on the row kernels
    return drafter


class TickClock:
    """A clock that advances `tick` seconds every time it is read: an engine driven by it measures
    the same step times on every machine."""

    def __init__(self, tick: float = 1e-3):
        self.now, self.tick = 0.0, tick

    def __call__(self) -> float:
        self.now += self.tick
        return self.now


def tiny_engine(mode: str = "scheduled", *, seed: int = 0, sps=None, max_running: int = 8, hf=None, clock=None,
                weight_format: str | None = None, **cfg) -> Engine:
    hf = hf or tiny_hf_target()
    target = TargetModel.from_hf_model(hf, weight_format)
    drafter = tiny_drafter_for(target) if mode != "target" else None
    config = EngineConfig(mode=mode, max_running=max_running, max_len=256, seed=seed, **cfg)
    kwargs = {"clock": clock} if clock is not None else {}
    return Engine(target, ToyTokenizer(), drafter, config=config, sps=sps, model_name="tiny", **kwargs)


def run_to_completion(engine: Engine, prompts, params_list) -> list[list[int]]:
    """Submit all prompts at once and step the engine (no thread) until every one finished."""
    return engine.generate(prompts, params_list, max_steps=100_000)


class OracleDrafter:
    """Proposes the target's own greedy continuation of one known prompt (`reference`), corrupting
    draft 3 of every other block, so both full acceptance and mid-block rejection happen; its
    drafts are one-hot, so verification stays exact. Blocks of any other request come from the
    wrapped drafter."""

    def __init__(self, drafter, prompt: list[int], reference: list[int]):
        self.inner, self.prompt_len, self.reference = drafter, len(prompt), reference
        self.gamma, self.config, self.confidence_head = drafter.gamma, drafter.config, drafter.confidence_head
        self.rounds = 0

    def draft(self, cache, slots, anchors, anchor_pos, sampler=None, generator=None, block=None):
        out = self.inner.draft(cache, slots, anchors, anchor_pos, sampler=sampler, block=block)
        g = out.tokens.shape[1]
        i = int(anchor_pos[0]) - self.prompt_len  # index of the anchor in the reference output
        if len(slots) != 1 or i < 0 or i + 1 + g > len(self.reference) or self.reference[i] != int(anchors[0]):
            return out
        tokens = torch.tensor(self.reference[i + 1 : i + 1 + g])[None]
        self.rounds += 1
        if self.rounds % 2 and g > 3:
            tokens[0, 3] = (tokens[0, 3] + 1) % VOCAB
        probs = torch.nn.functional.one_hot(tokens, VOCAB).float()
        return DraftOutput(tokens=tokens, probs=probs, conf_logits=out.conf_logits)


def greedy_reference(hf, prompt: list[int], n: int) -> list[int]:
    """transformers' own greedy continuation of `prompt`, exactly `n` tokens (EOS is not special)."""
    out = hf.generate(torch.tensor([prompt]), do_sample=False, max_new_tokens=n, min_new_tokens=n,
                      eos_token_id=None, pad_token_id=0)
    return out[0, len(prompt):].tolist()


class RejectedDrafter:
    """A drafter fault: for the one known prompt (`reference` is the target's greedy continuation),
    every draft is a token the target's greedy choice is not, so no draft is ever accepted. Rows
    it cannot place keep the wrapped drafter's blocks."""

    def __init__(self, drafter, prompt: list[int], reference: list[int]):
        self.inner, self.prompt_len, self.reference = drafter, len(prompt), reference

    def __getattr__(self, name):  # everything but draft() is the wrapped drafter's
        return getattr(self.inner, name)

    def draft(self, cache, slots, anchors, anchor_pos, sampler=None, generator=None, block=None):
        out = self.inner.draft(cache, slots, anchors, anchor_pos, sampler=sampler, block=block)
        tokens = out.tokens.clone()
        g = tokens.shape[1]
        for row in range(len(slots)):
            i = int(anchor_pos[row]) - self.prompt_len
            if 0 <= i and i + 1 + g <= len(self.reference) and self.reference[i] == int(anchors[row]):
                tokens[row] = (torch.tensor(self.reference[i + 1 : i + 1 + g]) + 1) % VOCAB
        probs = torch.nn.functional.one_hot(tokens, VOCAB).float()
        return DraftOutput(tokens=tokens, probs=probs, conf_logits=out.conf_logits)
