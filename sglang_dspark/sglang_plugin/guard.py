"""Every plugin hook runs inside SGLang's scheduler (its forward, `run_batch`, the planner), where an
uncaught exception ends the scheduler process and, with it, the server. So a hook that only exports
metrics or feeds the learner logs its first failure with the traceback, counts it, and steps aside
for the rest of the process; the budget hook falls back to SGLang's own `compute_verify_token_budget`
for that step and tries again on the next (its inputs are shared by every TP rank, so every rank
falls back together, and SGLang's budget is a decision every rank can make).

Counted in `sglang_dspark_plugin_hook_errors_total{hook}`; `sglang_dspark_plugin_hook_disabled{hook}`
is 1 once a hook stepped aside. Both live beside SGLang's own families (multiprocess-safe), and
counting never raises either.
"""

from __future__ import annotations

import logging

logger = logging.getLogger(__name__)

_failures: dict[str, int] = {}
_off: set[str] = set()
_metrics: tuple | None = None


def _families():
    global _metrics
    if _metrics is None:
        from prometheus_client import Counter, Gauge

        # registry=None: counted in the multiprocess files SGLang's /metrics reads, never in a registry
        # that a second import would collide with
        _metrics = (Counter("sglang_dspark_plugin_hook_errors", "Exceptions a plugin hook caught inside SGLang's "
                            "scheduler (sglang_plugin/guard.py)", ["hook"], registry=None),
                    Gauge("sglang_dspark_plugin_hook_disabled", "1 once a plugin hook stepped aside for the rest "
                          "of the process after an exception", ["hook"], registry=None, multiprocess_mode="max"))
    return _metrics


def is_off(hook: str) -> bool:
    return hook in _off


def failures(hook: str) -> int:
    return _failures.get(hook, 0)


def failed(hook: str, exc: BaseException, *, step_aside: bool) -> None:
    """Record that `hook` raised `exc`; `step_aside`: the hook is off for the rest of the process."""
    first = hook not in _failures
    _failures[hook] = _failures.get(hook, 0) + 1
    if step_aside:
        _off.add(hook)
    if first:
        then = "it is off for the rest of this process" if step_aside else "SGLang's own budget is used for the step"
        logger.error("sglang_dspark hook %s raised %s; %s (counted in sglang_dspark_plugin_hook_errors_total)",
                     hook, type(exc).__name__, then, exc_info=exc)
    try:
        errors, disabled = _families()
        errors.labels(hook=hook).inc()
        if step_aside:
            disabled.labels(hook=hook).set(1)
    except Exception:  # noqa: BLE001 - a full multiprocess directory must not end the scheduler either
        if first:
            logger.exception("sglang_dspark: could not count the failure of hook %s", hook)


def reset() -> None:
    """Forget every failure (tests)."""
    _failures.clear()
    _off.clear()
