"""Build the reference engine from model directories on disk."""

from __future__ import annotations

import logging
import os

logger = logging.getLogger(__name__)


def build_reference_engine(model_dir: str, draft_dir: str | None, profile: list[str] | str | None, mode: str,
                           max_running: int | None, max_len: int | None, seed: int = 0,
                           model_name: str | None = None):
    """Target + tokenizer from `model_dir`, drafter (sharing the target's embedding and lm_head) from
    `draft_dir`, SPS/STS from the `profile` files. `mode` "target" needs no drafter. None for
    max_running / max_len keeps EngineConfig's default."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")  # never reach for a hub: directories only
    import torch
    from transformers import AutoTokenizer

    from sglang_dspark.core.calibration import StsCalibration
    from sglang_dspark.core.sps import SpsTable
    from sglang_dspark.drafter.checkpoint import load_drafter
    from sglang_dspark.engine.engine import Engine, EngineConfig
    from sglang_dspark.engine.target_model import TargetModel
    from sglang_dspark.server.profiles import split_profiles

    sizes = {k: v for k, v in (("max_running", max_running), ("max_len", max_len)) if v is not None}
    config = EngineConfig(mode=mode, seed=seed, **sizes)
    torch.manual_seed(seed)
    target = TargetModel.from_pretrained(model_dir)
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    drafter = None
    if mode != "target":
        if draft_dir is None:
            raise ValueError(f"mode {mode!r} needs a drafter directory")
        drafter = load_drafter(draft_dir, target.embed_tokens, target.lm_head)
    paths = [profile] if isinstance(profile, str) else list(profile or ())
    sps_path, sts_path = split_profiles(paths)
    sps = SpsTable.load(sps_path) if sps_path else None
    sts = torch.tensor(StsCalibration.load(sts_path).temperatures) if sts_path else None
    logger.info("reference engine: target=%s draft=%s mode=%s sps=%s sts=%s", model_dir, draft_dir, mode,
                sps_path or "flat", sts_path or "none")
    return Engine(target, tokenizer, drafter, config=config, sps=sps, sts_temperatures=sts,
                  model_name=model_name or os.path.basename(os.path.normpath(model_dir)))
