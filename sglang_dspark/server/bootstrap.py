"""Build the reference engine from model directories on disk."""

from __future__ import annotations

import logging
import os

logger = logging.getLogger(__name__)


def build_reference_engine(model_dir: str, draft_dir: str | None, profile, mode: str,
                           max_running: int | None, max_len: int | None, seed: int = 0,
                           model_name: str | None = None, sla_tok_s_per_user: float | None = None):
    """Target + tokenizer from `model_dir`, drafter (sharing the target's embedding and lm_head) from
    `draft_dir`, SPS/STS from `profile` (an `SlaProfile`, a path to one, or None for a flat table and
    no calibration; its fingerprint is the caller's to check, see server/profiles.py). `mode` "target"
    needs no drafter. None for max_running / max_len keeps EngineConfig's default.
    `sla_tok_s_per_user` (an SLA tier's target) reaches EngineConfig when it has that field."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")  # never reach for a hub: directories only
    import dataclasses

    import torch
    from transformers import AutoTokenizer

    from sglang_dspark.drafter.checkpoint import load_drafter
    from sglang_dspark.engine.engine import Engine, EngineConfig
    from sglang_dspark.engine.target_model import TargetModel
    from sglang_dspark.profiles import SlaProfile

    sizes = {k: v for k, v in (("max_running", max_running), ("max_len", max_len)) if v is not None}
    if sla_tok_s_per_user is not None:
        if "sla_tok_s_per_user" in {f.name for f in dataclasses.fields(EngineConfig)}:
            sizes["sla_tok_s_per_user"] = sla_tok_s_per_user
        else:
            logger.warning("this engine has no SLA mode yet: sla_tok_s_per_user=%s is ignored", sla_tok_s_per_user)
    config = EngineConfig(mode=mode, seed=seed, **sizes)
    torch.manual_seed(seed)
    target = TargetModel.from_pretrained(model_dir)
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    drafter = None
    if mode != "target":
        if draft_dir is None:
            raise ValueError(f"mode {mode!r} needs a drafter directory")
        drafter = load_drafter(draft_dir, target.embed_tokens, target.lm_head)
    if isinstance(profile, (str, os.PathLike)):
        profile = SlaProfile.load(profile)
    sps = profile.sps_table() if profile is not None else None
    sts = profile.sts_temperatures() if profile is not None else None
    vocab = getattr(drafter, "draft_vocab", None)
    logger.info("reference engine: target=%s draft=%s (draft vocabulary: %s) mode=%s profile=%s sts=%s",
                model_dir, draft_dir, "full" if vocab is None else f"{vocab.numel()} hot tokens", mode,
                profile.name if profile is not None else "none (flat SPS)", "yes" if sts is not None else "none")
    return Engine(target, tokenizer, drafter, config=config, sps=sps, sts_temperatures=sts,
                  model_name=model_name or os.path.basename(os.path.normpath(model_dir)))
