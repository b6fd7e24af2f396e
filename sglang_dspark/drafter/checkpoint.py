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


# Keys that make a config.json a DSpark/DFlash drafter's rather than a plain model's (top level,
# or nested under `dflash_config` in z-lab's DFlash layout, which SGLang also reads).
DRAFTER_KEYS = ("target_layer_ids", "mask_token_id")


def read_drafter_config(ckpt_dir) -> dict:
    """config.json of a drafter directory as a dict; ValueError with one line when `ckpt_dir` is
    not a drafter (no config, no DSpark keys, no weights)."""
    path = Path(ckpt_dir)
    try:
        data = json.loads((path / CONFIG_NAME).read_text())
    except OSError as exc:
        raise ValueError(f"{path}: not a DSpark drafter directory (cannot read {CONFIG_NAME}: {exc.strerror})") from None
    except ValueError:
        raise ValueError(f"{path}: not a DSpark drafter directory ({CONFIG_NAME} is not JSON)") from None
    nested = data.get("dflash_config") if isinstance(data.get("dflash_config"), dict) else {}
    missing = [k for k in DRAFTER_KEYS if k not in data and k not in nested]
    if missing:
        raise ValueError(f"{path}: not a DSpark drafter directory ({CONFIG_NAME} has no {', '.join(missing)}; "
                         "drafters are written by python -m sglang_dspark.train)")
    if not (path / WEIGHTS_NAME).is_file():
        raise ValueError(f"{path}: not a DSpark drafter directory (no {WEIGHTS_NAME})")
    return data


def load_config(ckpt_dir) -> DSparkDraftConfig:
    """The drafter config of `ckpt_dir`; ValueError with one line when it is not a drafter."""
    data = read_drafter_config(ckpt_dir)
    try:
        return DSparkDraftConfig.from_dict(data)
    except (TypeError, ValueError, KeyError) as exc:
        raise ValueError(f"{ckpt_dir}: drafter config: {exc}") from None


def load_drafter(ckpt_dir, target_embed, target_lm_head, dtype=torch.float32, *,
                 draft_vocab: bool = True) -> DSparkDrafter:
    """Rebuild the drafter around the target's (shared, frozen) embedding and lm_head; with
    `draft_vocab`, drafting uses the directory's draft_vocab.pt when it has one. Weights keep
    PyTorch's layout; the engine repacks them for its CPU GEMMs (engine/cpu/weight_layout.py)."""
    config = load_config(ckpt_dir)
    drafter = DSparkDrafter(config, target_embed, target_lm_head)
    load_weights(drafter, ckpt_dir, dtype)
    drafter = drafter.to(dtype).eval()
    vocab_file = Path(ckpt_dir) / DRAFT_VOCAB_NAME
    if draft_vocab and vocab_file.exists():
        drafter.set_draft_vocab(load_draft_vocab(vocab_file))
    return drafter


def load_weights(drafter: DSparkDrafter, ckpt_dir, dtype=torch.float32) -> None:
    """The directory's model.safetensors into `drafter` (same config), every tensor as `dtype`."""
    state = load_file(str(Path(ckpt_dir) / WEIGHTS_NAME))
    drafter.load_state_dict({k: v.to(dtype) for k, v in state.items()}, strict=True)


def save_draft_vocab(token_ids, out_dir) -> Path:
    path = Path(out_dir) / DRAFT_VOCAB_NAME
    torch.save(torch.as_tensor(token_ids, dtype=torch.int64), path)
    return path


def load_draft_vocab(path) -> torch.Tensor:
    ids = torch.load(path, weights_only=True)
    return torch.as_tensor(ids, dtype=torch.int64)
