"""Tiny drafter factory shared by the drafter/train tests (built from a config in milliseconds)."""

from __future__ import annotations

import torch
from torch import nn

from sglang_dspark.drafter import DSparkDraftConfig, DSparkDrafter

TINY_TARGET = {
    "model_type": "llama", "architectures": ["LlamaForCausalLM"], "hidden_size": 32,
    "intermediate_size": 64, "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 8,
    "num_hidden_layers": 4, "vocab_size": 48, "rms_norm_eps": 1e-6, "rope_theta": 10000.0,
    "max_position_embeddings": 256, "tie_word_embeddings": True,
}


def tiny_config(**overrides) -> DSparkDraftConfig:
    dspark = dict(target_layer_ids=[0, 2], mask_token_id=3, num_hidden_layers=2, block_size=4,
                  markov_rank=8, markov_head_type="vanilla", enable_confidence_head=True)
    dspark.update(overrides)
    return DSparkDraftConfig.from_target_config(TINY_TARGET, **dspark)


def tiny_drafter(seed: int = 0, **overrides) -> DSparkDrafter:
    torch.manual_seed(seed)
    cfg = tiny_config(**overrides)
    embed = nn.Embedding(cfg.vocab_size, cfg.hidden_size)
    lm_head = nn.Linear(cfg.hidden_size, cfg.vocab_size, bias=False)
    drafter = DSparkDrafter(cfg, embed, lm_head)
    if drafter.markov_head is not None:  # a zero W2 would hide Markov-path bugs
        nn.init.normal_(drafter.markov_head.markov_w2.weight, std=0.5)
    return drafter.eval()
