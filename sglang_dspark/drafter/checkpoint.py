"""Drafter checkpoints in the DeepSpec layout that SGLang 0.5.23 loads.

A checkpoint directory holds `config.json` (target config + DSpark keys, see config.py) and
`model.safetensors` with the drafter's own weights under their HF names (`fc`, `hidden_norm`,
`layers.*` with q/k/v/o_proj, q_norm/k_norm and gate/up/down_proj, `norm`,
`markov_head.*`, `confidence_head.proj`). The target's embedding and lm_head are not saved.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

from sglang_dspark.drafter.config import DSparkDraftConfig
from sglang_dspark.drafter.model import DSparkDrafter
from sglang_dspark.core.weight_layout import input_major, pack_linears_for_cpu

CONFIG_NAME = "config.json"
WEIGHTS_NAME = "model.safetensors"
# Optional hot draft vocabulary: torch.save of a 1-D int64 tensor of token ids, the format of
# SGLang's --speculative-token-map (spec_utils.load_token_map reads it).
DRAFT_VOCAB_NAME = "draft_vocab.pt"


def save_drafter(drafter: DSparkDrafter, config: DSparkDraftConfig, out_dir, dtype=None) -> Path:
    """Write config.json + model.safetensors (weights cast to `dtype` when given)."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    tensors = {
        name: (t.detach().to(dtype) if dtype is not None else t.detach()).contiguous()
        for name, t in drafter.state_dict().items()
    }
    tmp = out / (WEIGHTS_NAME + ".tmp")
    save_file(tensors, str(tmp), metadata={"format": "pt"})
    os.replace(tmp, out / WEIGHTS_NAME)
    with open(out / CONFIG_NAME, "w") as f:
        json.dump(config.to_dict(), f, indent=2, sort_keys=True)
    return out


def load_config(ckpt_dir) -> DSparkDraftConfig:
    with open(Path(ckpt_dir) / CONFIG_NAME) as f:
        return DSparkDraftConfig.from_dict(json.load(f))


def load_drafter(ckpt_dir, target_embed, target_lm_head, dtype=torch.float32, *,
                 draft_vocab: bool = True) -> DSparkDrafter:
    """Rebuild the drafter around the target's (shared, frozen) embedding and lm_head; with
    `draft_vocab`, drafting uses the directory's draft_vocab.pt when it has one."""
    config = load_config(ckpt_dir)
    drafter = DSparkDrafter(config, target_embed, target_lm_head)
    state = load_file(str(Path(ckpt_dir) / WEIGHTS_NAME))
    drafter.load_state_dict({k: v.to(dtype) for k, v in state.items()}, strict=True)
    drafter = drafter.to(dtype).eval()
    pack_drafter_for_cpu(drafter)
    vocab_file = Path(ckpt_dir) / DRAFT_VOCAB_NAME
    if draft_vocab and vocab_file.exists():
        drafter.set_draft_vocab(load_draft_vocab(vocab_file))
    return drafter


def save_draft_vocab(token_ids, out_dir) -> Path:
    path = Path(out_dir) / DRAFT_VOCAB_NAME
    torch.save(torch.as_tensor(token_ids, dtype=torch.int64), path)
    return path


def load_draft_vocab(path) -> torch.Tensor:
    ids = torch.load(path, weights_only=True)
    return torch.as_tensor(ids, dtype=torch.int64)


def pack_drafter_for_cpu(drafter: DSparkDrafter) -> None:
    """Input-major CPU weights for inference (core/weight_layout.py), including the shared
    lm_head buffer, whose [R * gamma, V] logits GEMM is the drafter's largest."""
    pack_linears_for_cpu(drafter)
    if drafter.lm_head_weight.device.type == "cpu":
        drafter.lm_head_weight = input_major(drafter.lm_head_weight)
