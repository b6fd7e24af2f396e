"""What the plugin does, from the environment the launcher sets (`launch_sglang.py`):

    SGLANG_DSPARK_PROFILE    an SLA profile YAML: its SPS table prices the SLA decision and the
                             learner's prior; its tiers name SGLANG_DSPARK_SLA_TIER
    SGLANG_DSPARK_SLA_TIER   a tier of that profile: the planner hook returns the bundle's SLA budget
    SGLANG_DSPARK_SPS_LEARNING=1   the planner hook prices budgets with the table learned online from
                             this worker's steps (one attention-TP rank only: a table learned per rank
                             would give ranks different CUDA-graph sizes)

With none of them set the plugin changes no decision; it still exports metrics when SGLang runs
with --enable-metrics. Everything is read lazily, inside the worker process, once.
"""

from __future__ import annotations

import functools
import os
from dataclasses import dataclass

PROFILE_ENV = "SGLANG_DSPARK_PROFILE"
TIER_ENV = "SGLANG_DSPARK_SLA_TIER"
LEARNING_ENV = "SGLANG_DSPARK_SPS_LEARNING"


@dataclass(frozen=True)
class PluginSettings:
    profile: object | None  # SlaProfile
    tier: object | None  # SlaTier
    learning: bool

    @property
    def changes_decisions(self) -> bool:
        return self.tier is not None or self.learning


@functools.lru_cache(maxsize=1)
def settings() -> PluginSettings:
    """ProfileError (one line) for a bad profile or an unknown tier: better a worker that refuses to
    start than one that silently ignores its SLA."""
    from sglang_dspark.profile.schema import ProfileError, SlaProfile

    path, tier_name = os.environ.get(PROFILE_ENV), os.environ.get(TIER_ENV)
    profile = SlaProfile.load(path) if path else None
    if tier_name and profile is None:
        raise ProfileError(f"{TIER_ENV}={tier_name} needs {PROFILE_ENV} (the tiers live in the profile)")
    tier = profile.tier(tier_name) if tier_name else None
    return PluginSettings(profile, tier, os.environ.get(LEARNING_ENV, "") not in ("", "0", "false"))
