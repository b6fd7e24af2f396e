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

CONFIG_NAME = "config.json"
WEIGHTS_NAME = "model.safetensors"


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


def load_drafter(ckpt_dir, target_embed, target_lm_head, dtype=torch.float32) -> DSparkDrafter:
    """Rebuild the drafter around the target's (shared, frozen) embedding and lm_head."""
    config = load_config(ckpt_dir)
    drafter = DSparkDrafter(config, target_embed, target_lm_head)
    state = load_file(str(Path(ckpt_dir) / WEIGHTS_NAME))
    drafter.load_state_dict({k: v.to(dtype) for k, v in state.items()}, strict=True)
    return drafter.to(dtype).eval()
