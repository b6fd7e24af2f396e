"""STS data collection in SGLang 0.5.23 (`SGLANG_DSPARK_STS_COLLECT_PATH`), fixed by hooks:

- every TP and DP rank wrote the same shard names: the recorder class is replaced by one that adds
  `.dp<rank>.tp<rank>` to the path stem;
- the last partial shard (up to 255 steps) was never written: recorders flush at graceful shutdown
  (after `Scheduler.release_host_resources`) and at interpreter exit;
- compact verify scatters padded rows, so the labels it would record are wrong: a worker in compact
  mode with collection on refuses to start, saying so.
"""

from __future__ import annotations

import atexit
import pkgutil
import weakref

from sglang_dspark.sglang_plugin.targets import PARALLEL

_RECORDERS: weakref.WeakSet = weakref.WeakSet()


def per_rank_recorder(base: type) -> type:
    """A subclass of SGLang's StsDataRecorder writing per-rank files and flushing at exit."""

    class PerRankStsRecorder(base):
        def __init__(self, *, path_stem: str, gamma: int, flush_every: int):
            parallel = pkgutil.resolve_name(PARALLEL)()
            super().__init__(path_stem=f"{path_stem}.dp{parallel.dp_rank}.tp{parallel.tp_rank}", gamma=gamma,
                             flush_every=flush_every)
            _RECORDERS.add(self)
            ref = weakref.ref(self)
            atexit.register(lambda: (recorder := ref()) is not None and recorder.flush())

    PerRankStsRecorder.__qualname__ = PerRankStsRecorder.__name__ = "PerRankStsRecorder"
    return PerRankStsRecorder


def flush_all(*_args, **_kwargs) -> None:
    """AFTER Scheduler.release_host_resources: write every recorder's last partial shard."""
    for recorder in list(_RECORDERS):
        recorder.flush()


def refuse_compact_collection(_result, observers, *args, **kwargs) -> None:
    """AFTER DsparkStepObservers.__init__."""
    planner = getattr(observers, "_planner", None)
    if getattr(observers, "_sts_collect_path", None) and getattr(planner, "is_compact_mode", False):
        raise ValueError("SGLANG_DSPARK_STS_COLLECT_PATH records wrong labels in compact verify mode (padded rows "
                         "are scattered); collect with SGLANG_RAGGED_VERIFY_MODE=static")
