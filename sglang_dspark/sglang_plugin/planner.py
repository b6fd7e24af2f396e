"""The planner hook: AROUND SGLang's `compute_verify_token_budget`.

SGLang calls it once per decode step on every TP rank, from the lagged survival matrix, and the
budget it returns picks the step's CUDA-graph size, so every rank must reach the same number: the
decision here reads only what all ranks share (the survival matrix, the profile's table, the
tier, and the lag calibration, fed only from what all ranks share: lag.py). In SLA mode the budget
is the bundle's SLA decision (core/schedule.py); with online learning the original runs on the
learned table instead of the profile's; with the lag calibration on (settings.py) either reads the
lagged rows as corrected by past outcomes (lag.py); with the plugin changing nothing the original
runs untouched. The original is always reached through `original_fn`, never a module-level name (the
hook registry rebinds those to this wrapper).
"""

from __future__ import annotations

import functools
import logging
import sys

from sglang_dspark.sglang_plugin import guard
from sglang_dspark.sglang_plugin.settings import profile_table, settings

logger = logging.getLogger(__name__)


BUDGET_HOOK = "compute_verify_token_budget"


class _OriginalRaised(Exception):
    """SGLang's own budget raised: its exception, not the plugin's, so it is not caught."""


def around_budget(original_fn, *, history_survival_probs, sps_table, cfg):
    """The step's budget (see the module doc); when the plugin's part raises, SGLang's own budget
    for this step (guard.py), and the plugin's again from the next."""
    @functools.wraps(original_fn)  # keeps __module__: the decision struct is read from it
    def original(**kw):
        try:
            return original_fn(**kw)
        except Exception as exc:
            raise _OriginalRaised() from exc

    try:
        return _budget(original, history_survival_probs=history_survival_probs, sps_table=sps_table, cfg=cfg)
    except _OriginalRaised as wrapped:
        raise wrapped.__cause__ from None
    except Exception as exc:  # noqa: BLE001 - guard.py: the plugin never ends SGLang's scheduler
        guard.failed(BUDGET_HOOK, exc, step_aside=False)
        return original_fn(history_survival_probs=history_survival_probs, sps_table=sps_table, cfg=cfg)


def _budget(original_fn, *, history_survival_probs, sps_table, cfg):
    plugin = settings()
    if not plugin.changes_decisions:
        return original_fn(history_survival_probs=history_survival_probs, sps_table=sps_table, cfg=cfg)
    if not plugin.lag_calibration:
        return _decide(original_fn, plugin, history_survival_probs, sps_table, cfg)
    from sglang_dspark.sglang_plugin import lag

    rows = lag.feed().read(history_survival_probs)  # the lagged rows as they have held up
    decision = _decide(original_fn, plugin, rows.survival, sps_table, cfg)
    lag.feed().plan(rows, decision)  # paired with its step's outcome by the observer
    return decision


def _decide(original_fn, plugin, survival, sps_table, cfg):
    """SGLang's decision on `survival` (on the learned table when learning), or the SLA decision."""
    from sglang_dspark.sglang_plugin.observer import learned_table

    learned = learned_table() if plugin.learning else None
    if plugin.tier is None:
        table = learned.table if learned is not None else sps_table
        return original_fn(history_survival_probs=survival, sps_table=table, cfg=cfg)
    from sglang_dspark.core.schedule import decide_budget_sla

    ours = learned.ours if learned is not None else profile_table()
    if plugin.graph_tokens:  # priced at the CUDA graph SGLang will run the budget as
        from sglang_dspark.sglang_plugin.padded import PaddedTable

        ours = PaddedTable(ours, plugin.graph_tokens)
    # the candidates SGLang's own budget considers: the first max_verify_len drafts, above its floor
    survival = survival[:, : cfg.resolved_max_verify_len()]
    survival = survival.masked_fill(survival < cfg.survival_eps, 0.0)
    decision = decide_budget_sla(survival, ours, plugin.tier.tok_s_per_user)
    budget_decision = sys.modules[original_fn.__module__].VerifyBudgetDecision
    return budget_decision(budget=decision.budget, predicted_step_seconds=decision.predicted_step_seconds,
                           predicted_theta=decision.predicted_theta)
