"""DSpark draft model (pure torch): backbone, Markov / confidence heads, checkpoint I/O."""

from sglang_dspark.drafter.checkpoint import load_config, load_drafter, save_drafter
from sglang_dspark.drafter.config import DSparkDraftConfig
from sglang_dspark.drafter.model import DraftKVCache, DraftOutput, DSparkDrafter, TrainOutput
from sglang_dspark.drafter.sampling import argmax_sampler, greedy_sampler, temperature_sampler

__all__ = [
    "DSparkDraftConfig", "DSparkDrafter", "DraftKVCache", "DraftOutput", "TrainOutput",
    "save_drafter", "load_drafter", "load_config", "argmax_sampler", "greedy_sampler", "temperature_sampler",
]
