"""Drafter configuration: the target's config plus the DeepSpec/SGLang DSpark keys.

config.json of a drafter is the target's config.json with the DSpark keys written on top, the
layout SGLang 0.5.23's `parse_dspark_draft_config` reads (top-level keys, no nesting).
`markov_rank = 0` is the DFlash ablation: no Markov head, confidence head without the Markov
feature; SGLang's DSpark class refuses such a checkpoint, so it is tagged as its DFlash class.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

MARKOV_HEAD_TYPES = ("vanilla", "gated", "rnn")
DSPARK_ARCHITECTURE = "Qwen3DSparkModel"
DFLASH_ARCHITECTURE = "DFlashDraftModel"


@dataclass
class DSparkDraftConfig:
    hidden_size: int
    intermediate_size: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    vocab_size: int
    target_layer_ids: list[int]
    num_target_layers: int
    mask_token_id: int
    num_hidden_layers: int = 1
    block_size: int = 7
    markov_rank: int = 64
    markov_head_type: str = "vanilla"
    enable_confidence_head: bool = True
    confidence_head_with_markov: bool | None = None  # None: follow markov_rank > 0 (SGLang's default)
    rms_norm_eps: float = 1e-6
    rope_theta: float = 10000.0
    max_position_embeddings: int = 8192
    # Every other key of the target's config, carried through to config.json untouched.
    target_config: dict = field(default_factory=dict)

    def __post_init__(self):
        if self.confidence_head_with_markov is None:
            self.confidence_head_with_markov = self.markov_rank > 0
        if self.markov_rank < 0:
            raise ValueError(f"markov_rank must be >= 0, got {self.markov_rank}")
        if self.markov_rank > 0 and self.markov_head_type not in MARKOV_HEAD_TYPES:
            raise ValueError(f"markov_head_type must be one of {MARKOV_HEAD_TYPES}")
        if self.confidence_head_with_markov and self.markov_rank == 0:
            raise ValueError("confidence_head_with_markov needs markov_rank > 0")
        if not 0 <= self.mask_token_id < self.vocab_size:
            raise ValueError(f"mask_token_id {self.mask_token_id} outside vocab {self.vocab_size}")
        if self.num_target_layers <= max(self.target_layer_ids):
            raise ValueError("target_layer_ids must be < num_target_layers")
        self.target_layer_ids = [int(x) for x in self.target_layer_ids]

    @property
    def gamma(self) -> int:
        return self.block_size

    @property
    def has_markov(self) -> bool:
        return self.markov_rank > 0

    @classmethod
    def from_target_config(cls, target: dict, **dspark) -> "DSparkDraftConfig":
        """Build from a target's config.json dict; `dspark` sets the drafter's own keys."""
        rope_theta = target.get("rope_theta") or (target.get("rope_parameters") or {}).get(
            "rope_theta", 10000.0
        )
        heads = int(target["num_attention_heads"])
        return cls(
            hidden_size=int(target["hidden_size"]),
            intermediate_size=int(target["intermediate_size"]),
            num_attention_heads=heads,
            num_key_value_heads=int(target.get("num_key_value_heads", heads)),
            head_dim=int(target.get("head_dim") or target["hidden_size"] // heads),
            vocab_size=int(target["vocab_size"]),
            num_target_layers=int(target["num_hidden_layers"]),
            rms_norm_eps=float(target.get("rms_norm_eps", 1e-6)),
            rope_theta=float(rope_theta),
            max_position_embeddings=int(target.get("max_position_embeddings", 8192)),
            target_config=dict(target),
            **dspark,
        )

    @classmethod
    def from_dict(cls, data: dict) -> "DSparkDraftConfig":
        names = {f.name for f in dataclasses.fields(cls)} - {"target_config"}
        own = {k: data[k] for k in names if k in data}
        if "rope_theta" not in own and "rope_parameters" in data:
            own["rope_theta"] = data["rope_parameters"].get("rope_theta", 10000.0)
        rest = {k: v for k, v in data.items() if k not in names}
        return cls(**own, target_config=rest)

    def to_dict(self) -> dict:
        own = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}
        own.pop("target_config")
        arch = DSPARK_ARCHITECTURE if self.has_markov else DFLASH_ARCHITECTURE
        out = {**self.target_config, **own}
        out["architectures"] = [arch]
        out["tie_word_embeddings"] = False
        if not self.has_markov:
            out.pop("markov_head_type", None)  # meaningless without a Markov head
        return out
