"""The bundle inside SGLang 0.5.23: a `sglang.srt.plugins` plugin, not a fork.

`register()` runs once in every SGLang process (entry point `sglang.srt.plugins:sglang_dspark` in
pyproject.toml; `SGLANG_PLUGINS`, when set, must list it). It checks the SGLang version and that
every hook target exists, and registers nothing (SGLang keeps working) when either fails: one
ERROR line, and `sglang_dspark_plugin_active` 0 on /metrics (1 when registered). The hooks
(targets.py): the SLA / learned-table planner (planner.py, padded.py), metrics and the learner's
feed from the step observer (observer.py; its refits in a worker process, fitter.py, and the learned
table's file, export.py), and the STS collection fixes (sts.py).

Nothing here imports prometheus_client or reads SGLang's parallel config at load time: SGLang sets
PROMETHEUS_MULTIPROC_DIR and publishes ranks later; both are read inside the hooks.
"""

from __future__ import annotations

import functools
import logging
import os
import pkgutil
from importlib import metadata

from sglang_dspark.sglang_plugin import targets

logger = logging.getLogger(__name__)


def check() -> str | None:
    """None when this SGLang is the one the hooks were written for, else why not (one line)."""
    try:
        version = metadata.version("sglang")
    except metadata.PackageNotFoundError:
        return "sglang is not installed"
    if version not in targets.TESTED_VERSIONS:
        return (f"sglang {version} is installed; the hooks were tested against {', '.join(targets.TESTED_VERSIONS)} "
                "only (sglang_dspark/sglang_plugin/targets.py TESTED_VERSIONS)")
    missing = []
    for target in (*targets.HOOKED, *targets.READ):
        try:
            pkgutil.resolve_name(target)
        except (ImportError, AttributeError, ValueError):
            missing.append(target)
    return f"hook targets missing in this sglang: {', '.join(missing)}" if missing else None


@functools.lru_cache(maxsize=1)
def hooks() -> tuple[tuple[str, object, str], ...]:
    """(target, hook, hook type name) for every hook the plugin installs (one set per process)."""
    from sglang_dspark.sglang_plugin import observer, planner, sts

    recorder = sts.per_rank_recorder(pkgutil.resolve_name(targets.STS_RECORDER))
    return (
        (targets.PLANNER, planner.around_budget, "AROUND"),
        (targets.OBSERVE_STEP, observer.around_observe_step, "AROUND"),
        (targets.PREFILL_STEP, observer.after_prefill_step, "AFTER"),
        (targets.REQUEST_FINISHED, observer.after_request_finished, "AFTER"),
        (targets.OBSERVERS_INIT, observer.after_observers_init, "AFTER"),
        (targets.SCHEDULER_SHUTDOWN, observer.after_scheduler_shutdown, "AFTER"),
        (targets.SCHEDULER_ABORT, observer.after_abort_request, "AFTER"),
        (targets.STS_RECORDER, recorder, "REPLACE"),
    )


ACTIVE_METRIC = "sglang_dspark_plugin_active"


def report_active(active: bool) -> None:
    """`sglang_dspark_plugin_active` in SGLang's multiprocess registry, where its directory is set
    already (scheduler processes inherit it; importing prometheus_client before it is set would
    hide SGLang's own metrics). `min` over processes: one rank standing down shows 0."""
    if not os.environ.get("PROMETHEUS_MULTIPROC_DIR"):
        return
    from prometheus_client import Gauge

    gauge = Gauge(ACTIVE_METRIC, "1 when the sglang_dspark plugin registered its hooks in this SGLang process, "
                  "0 when it stood down (SLA tier, profile and learning are then not applied)", registry=None,
                  multiprocess_mode="min")
    gauge.set(1.0 if active else 0.0)


def register() -> None:
    reason = check()
    if reason is not None:
        logger.error("sglang_dspark plugin NOT registered: %s; SGLang runs without it (no SLA tier, no profile "
                     "planner, no learning, no sglang_dspark_* metrics)", reason)
        report_active(False)
        return
    from sglang.srt.plugins.hook_registry import HookRegistry, HookType

    for target, hook, kind in hooks():
        HookRegistry.register(target, hook, HookType[kind])
    report_active(True)
    logger.info("sglang_dspark plugin registered %d hooks", len(targets.HOOKED))
