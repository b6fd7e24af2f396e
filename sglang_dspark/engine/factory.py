"""Engines from model directories on disk: the one place that loads a target, its tokenizer and
a drafter, and packs their weights for the CPU."""

from __future__ import annotations

import glob
import logging
import os
from contextlib import ExitStack

import torch

from sglang_dspark.core.sps import SpsTable
from sglang_dspark.engine.engine import Engine, EngineConfig
from sglang_dspark.engine.heap import release_freed_memory
from sglang_dspark.engine.cpu.formats import WeightFormat, checkpoint_int4_grid, choose_auto, native_bf16_flags
from sglang_dspark.engine.target_model import TargetModel
from sglang_dspark.engine.threads import ENGINE_THREAD, EngineThreads

logger = logging.getLogger(__name__)


def resolve_weight_format(weight_format: str, model_dir) -> tuple[str, str]:
    """(format, why) for a requested format; `auto` (engine/cpu/formats.py) reads a sample of the
    target's decoder weights where the CPU has native bfloat16 (are they already 4-bit?), and
    elsewhere times Linear weights of the target's own shapes, read from the safetensors headers
    only. Call after setting torch's thread count."""
    if weight_format != "auto":
        return weight_format, "as requested"
    native = native_bf16_flags()
    if native:  # decided by the flags and whether the weights are already 4-bit: nothing to time
        return choose_auto([], native=native, int4_grid=checkpoint_int4_grid(*_sampled_decoder_weights(model_dir)))
    from safetensors import safe_open

    shapes = []
    try:
        for path in _safetensors(model_dir):
            with safe_open(path, framework="pt") as f:
                shapes += [f.get_slice(name).get_shape() for name in f.keys()
                           if name.endswith("_proj.weight") or name.endswith("embed_tokens.weight")]
    except Exception as exc:  # safetensors' own error type; loading the model reports it properly
        return "float32", f"weights not readable to time ({type(exc).__name__})"
    shapes = [s for s in shapes if len(s) == 2]
    if not shapes:
        return "float32", "no Linear weights found to time"
    # distinct buffers, so they stream from memory as a real step's weights do; values are
    # irrelevant to a GEMM's speed as long as they are normal floats
    return choose_auto([torch.empty(s).uniform_(-0.05, 0.05) for s in shapes])


def _safetensors(model_dir) -> list[str]:
    return sorted(glob.glob(os.path.join(str(model_dir), "*.safetensors")))


# rows read of each sampled weight: enough groups to tell a 4-bit checkpoint, a small read
SAMPLED_ROWS = 256


def _sampled_decoder_weights(model_dir) -> tuple[dict, dict]:
    """The first SAMPLED_ROWS rows of the first and the last decoder layer's projection weights
    (whether a checkpoint is 4-bit shows in any of them; reading all would read the model twice),
    and their full shapes; empty where unreadable (logged: auto then takes bfloat16, and loading
    reports the file)."""
    from safetensors import safe_open

    try:
        with ExitStack() as files:
            names = {}
            for path in _safetensors(model_dir):
                f = files.enter_context(safe_open(path, framework="pt"))
                names.update({name: f for name in f.keys() if name.endswith("_proj.weight") and ".layers." in name})
            layers = sorted({int(n.split(".layers.", 1)[1].split(".", 1)[0]) for n in names})
            if not layers:
                logger.info("auto: no decoder-layer projection weights (*.layers.N.*_proj.weight) in %s to check "
                            "for 4-bit values", model_dir)
                return {}, {}
            keep = {f".layers.{layers[0]}.", f".layers.{layers[-1]}."}
            sampled = {n: f.get_slice(n) for n, f in names.items() if any(k in n for k in keep)}
            return ({n: s[:SAMPLED_ROWS] for n, s in sampled.items()},
                    {n: tuple(s.get_shape()) for n, s in sampled.items()})
    except Exception as exc:  # safetensors' own error types, a malformed layer name
        logger.warning("auto: could not read the checkpoint's decoder weights to check for 4-bit values (%s: %s)",
                       type(exc).__name__, exc)
        return {}, {}


def load_models(model_dir, draft_dir=None, *, draft_vocab: bool = True, tune: bool = True,
                weight_format: str = "float32", row_kernels: bool = True):
    """(TargetModel, tokenizer, drafter or None): the drafter shares the target's embedding and
    lm_head; with `draft_vocab` it drafts from its hot vocabulary when it ships one. Both models run
    in `weight_format` (engine/cpu/formats.py; `auto` is resolved here, and the choice is logged and
    kept as `target.weight_format`); `row_kernels=False` keeps int8 and int4 on aten's kernels (the
    side-by-side benchmarks). With `tune`, float32's CPU weight layouts and bfloat16's one-row kernel
    are timed on this host (`WeightFormat.tune`; call after setting torch's thread count, which
    changes the answers)."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")  # directories only, never a hub
    from transformers import AutoTokenizer

    from sglang_dspark.drafter.checkpoint import load_drafter

    name, why = resolve_weight_format(weight_format, model_dir)
    logger.info("weight format %s (%s)", name, why)
    fmt = WeightFormat.of(name, row_kernels=row_kernels)
    target = TargetModel.from_pretrained(str(model_dir), weight_format=fmt)
    logger.info("%s", fmt.describe(target))
    tokenizer = AutoTokenizer.from_pretrained(str(model_dir))
    drafter = None
    if draft_dir is not None:
        drafter = load_drafter(draft_dir, target.embed_tokens, target.lm_head_weight(),
                               dtype=fmt.dtype, draft_vocab=draft_vocab)
        fmt.prepare_drafter(drafter)
    if tune and target.embed_tokens.weight.device.type == "cpu":
        fmt.tune([m for m in (target, drafter) if m is not None])
    release_freed_memory()  # the float32 checkpoint and the timing copies, freed, not yet returned
    return target, tokenizer, drafter


def build_engine(model_dir, draft_dir=None, *, config: EngineConfig | None = None, sps: SpsTable | None = None,
                 sts: torch.Tensor | None = None, model_name: str | None = None, draft_vocab: bool = True,
                 sps_seeded: bool = False, identity: dict | None = None, weight_format: str = "float32",
                 threads: EngineThreads | None = None) -> Engine:
    """An engine over the models in `model_dir` (and `draft_dir`, which every mode but "target"
    needs). `sps` / `sts`: the SPS table and STS temperatures (a profile's; `sps_seeded` when it was
    measured on other hardware), else none and uncalibrated confidences. `identity`: the
    deployment's fingerprint, for /server_info. `weight_format`: see load_models. `threads`: what
    the caller set up on this, the engine thread (engine/threads.py), for the log and /server_info."""
    config = config or EngineConfig()
    if config.mode != "target" and draft_dir is None:
        raise ValueError(f"mode {config.mode!r} needs a drafter directory")
    torch.manual_seed(config.seed)
    target, tokenizer, drafter = load_models(model_dir, draft_dir if config.mode != "target" else None,
                                             draft_vocab=draft_vocab, weight_format=weight_format)
    engine = Engine(target, tokenizer, drafter, config=config, sps=sps, sts_temperatures=sts,
                    model_name=model_name or os.path.basename(os.path.normpath(str(model_dir))),
                    sps_seeded=sps_seeded, identity=identity, model_path=os.path.abspath(str(model_dir)))
    vocab = getattr(drafter, "draft_vocab", None)
    logger.info("reference engine: target=%s draft=%s (draft vocabulary: %s) weights=%s mode=%s SPS table=%s "
                "sts=%s context=%d tokens, %d slots, KV cache up to %.2f GiB (committed as used)",
                model_dir, draft_dir, "full" if vocab is None else f"{vocab.numel()} hot tokens", target.weight_format,
                config.mode,
                engine.policy.source, "yes" if sts is not None else "none",
                engine.max_len, config.max_running, engine.runner.kv_bytes() / 2**30)
    if threads is not None:
        engine.threads = threads
        team = threads.report()
        logger.info("engine threads: %d torch threads (%s) on a team of %d native threads named %r",
                    team["torch_threads"], team["set_by"], team["engine_team_native_threads"], ENGINE_THREAD)
    return engine
