"""STS data collection in SGLang 0.5.23 (`SGLANG_DSPARK_STS_COLLECT_PATH`), fixed by hooks:

- every TP and DP rank wrote the same shard names, and a relaunch restarted the shard count and
  overwrote the last run: the recorder class is replaced by one that writes from one rank per DP
  group only (attention-TP rank 0: the other ranks hold the same rows, which SGLang's glob-reading
  fit tool would count again) and adds `.<run id>.dp<rank>` to the path stem (the run id: this
  process's start time, pid and a random tag, or `SGLANG_DSPARK_STS_RUN_ID`), so
  `dspark_sts_fit --data-glob 'STEM.*.pt'` reads every run once;
- the last partial shard (up to 255 steps) was never written: recorders flush at graceful shutdown
  (after `Scheduler.release_host_resources`) and at interpreter exit;
- compact verify scatters padded rows, so the labels it would record are wrong: a worker in compact
  mode with collection on refuses to start, saying so.
"""

from __future__ import annotations

import atexit
import functools
import os
import pkgutil
import secrets
import time
import weakref

from sglang_dspark.sglang_plugin.targets import PARALLEL

_RECORDERS: weakref.WeakSet = weakref.WeakSet()
RUN_ID_ENV = "SGLANG_DSPARK_STS_RUN_ID"


@functools.lru_cache(maxsize=1)
def run_id() -> str:
    """One per process (a relaunch gets a new one): names this run's shards apart from earlier runs'."""
    return os.environ.get(RUN_ID_ENV) or f"{time.strftime('%Y%m%dT%H%M%S')}-{os.getpid()}-{secrets.token_hex(2)}"


def per_rank_recorder(base: type) -> type:
    """A subclass of SGLang's StsDataRecorder writing per-rank files and flushing at exit."""

    class PerRankStsRecorder(base):
        def __init__(self, *, path_stem: str, gamma: int, flush_every: int):
            parallel = pkgutil.resolve_name(PARALLEL)()
            self.writes = getattr(parallel, "attn_tp_rank", parallel.tp_rank) == 0
            dp_rank = parallel.dp_rank if parallel.dp_rank is not None else 0  # None without DP
            super().__init__(path_stem=f"{path_stem}.{run_id()}.dp{dp_rank}", gamma=gamma, flush_every=flush_every)
            _RECORDERS.add(self)
            ref = weakref.ref(self)
            atexit.register(lambda: (recorder := ref()) is not None and recorder.flush())

        def record(self, **kwargs) -> None:
            if self.writes:  # the other ranks of the group would write the same rows (and copy to host for it)
                super().record(**kwargs)

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
