"""What the plugin does, from the environment the launcher sets (`launch_sglang.py`):

    SGLANG_DSPARK_PROFILE    an SLA profile YAML: its SPS table prices the SLA decision and the
                             learner's prior; its tiers name SGLANG_DSPARK_SLA_TIER
    SGLANG_DSPARK_SLA_TIER   a tier of that profile: the planner hook returns the bundle's SLA budget
    SGLANG_DSPARK_SPS_LEARNING=1   the planner hook prices budgets with the table learned online from
                             this worker's steps (one attention-TP rank only: a table learned per rank
                             would give ranks different CUDA-graph sizes)

    SGLANG_DSPARK_EXPORT_DIR=DIR   where a learning worker writes its learned table every minute
                             (learned-sps.dp<rank>.json; `profile snapshot --from-dir DIR` keeps it):
                             the launcher sets the directory it exported the profile's JSON to

    SGLANG_DSPARK_LAG_CALIBRATION=0|1   the planner hook reads SGLang's lagged confidence rows as
                             past verified drafts say they hold up (lag.py); on by default wherever
                             a tier or learning makes the plugin decide, off otherwise (SGLang's own
                             planner untouched); 1 turns it on alone, 0 off

    SGLANG_DSPARK_GRAPH_TOKENS=N,N,...   the verify token sizes SGLang captures CUDA graphs for
                             (the launcher's --cuda-graph-bs-decode times gamma + 1): the SLA
                             decision prices a budget at the graph it runs as (padded.py)

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
GRAPH_TOKENS_ENV = "SGLANG_DSPARK_GRAPH_TOKENS"
EXPORT_DIR_ENV = "SGLANG_DSPARK_EXPORT_DIR"
LAG_CALIBRATION_ENV = "SGLANG_DSPARK_LAG_CALIBRATION"
OFF = ("", "0", "false")


@dataclass(frozen=True)
class PluginSettings:
    profile: object | None  # SlaProfile
    tier: object | None  # SlaTier
    learning: bool
    graph_tokens: tuple[int, ...] | None = None  # captured verify sizes, ascending
    export_dir: str | None = None  # where the learned table is written
    lag_calibration: bool = False  # the budget reads lagged rows corrected by past outcomes (lag.py)

    @property
    def changes_decisions(self) -> bool:
        return self.tier is not None or self.learning or self.lag_calibration


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
    graph = os.environ.get(GRAPH_TOKENS_ENV, "").strip()
    try:
        sizes = tuple(sorted({int(x) for x in graph.split(",") if x.strip()})) if graph else None
    except ValueError:
        raise ProfileError(f"{GRAPH_TOKENS_ENV}={graph!r}: expected comma-separated token counts") from None
    if sizes is not None and (not sizes or sizes[0] < 1):
        raise ProfileError(f"{GRAPH_TOKENS_ENV}={graph!r}: token counts must be >= 1")
    learning = os.environ.get(LEARNING_ENV, "") not in OFF
    return PluginSettings(profile, tier, learning, sizes, os.environ.get(EXPORT_DIR_ENV) or None,
                          _lag_calibration(default=tier is not None or learning))


def _lag_calibration(default: bool) -> bool:
    """SGLANG_DSPARK_LAG_CALIBRATION where set, else on wherever the plugin decides budgets anyway."""
    value = os.environ.get(LAG_CALIBRATION_ENV)
    return default if value is None or not value.strip() else value.strip().lower() not in OFF


def refuse_inert_planner(observers) -> None:
    """At worker start: with a tier or learning configured, SGLang's planner must call the budget hook.
    In compact mode with a table SGLang reads as uninitialized (one probe, no additive table) it
    verifies every draft and never calls it, so the tier would be silently ignored: refuse (one line)."""
    plugin = settings()
    planner = getattr(observers, "_planner", None)
    if plugin.changes_decisions and getattr(planner, "is_verify_all", False):
        from sglang_dspark.profile.schema import ProfileError

        what = (f"SLA tier {plugin.tier.name!r}" if plugin.tier is not None else "online SPS learning"
                if plugin.learning else "the lag calibration")
        raise ProfileError(f"{what} would not apply: SGLang reads its --speculative-dspark-sps-table-path as no table "
                           "(one probe, no additive table), so its planner verifies every draft and never asks for "
                           "a budget; serve a full profile (both capture phases)")


@functools.lru_cache(maxsize=1)
def profile_table():
    """The profile's table as SGLang's worker runs it: always drafting (no drafter-skip saving)."""
    from sglang_dspark.core.sps import SpsTable

    sps = settings().profile.sps
    return SpsTable(sps.additive if sps.additive is not None else sps.cost)
