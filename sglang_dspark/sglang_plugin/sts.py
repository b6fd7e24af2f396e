"""STS data collection in SGLang 0.5.23 (`SGLANG_DSPARK_STS_COLLECT_PATH`), fixed by hooks:

- every TP and DP rank wrote the same shard names, and a relaunch restarted the shard count and
  overwrote the last run: the recorder class is replaced by one that writes from one rank per DP
  group only (attention-TP rank 0: the other ranks hold the same rows, which SGLang's glob-reading
  fit tool would count again) and adds `.<run id>.dp<rank>` to the path stem (the run id: this
  process's start time, pid and a random tag, or `SGLANG_DSPARK_STS_RUN_ID`), so
  `dspark_sts_fit --data-glob 'STEM.*.pt'` reads every run once;
- the last partial shard (up to 255 steps) was never written: recorders flush at graceful shutdown
  (after `Scheduler.release_host_resources`) and at interpreter exit; and, against a SIGKILL (the
  OOM killer, a node drain), the rows of the shard being filled are written every
  DURABLE_SECONDS under the name that shard will have, replaced whole each time and at last by the
  full shard, so the fit tool's glob reads each row once whenever the process dies, and a kill
  loses at most DURABLE_SECONDS of rows (shards are written to a temporary name, then renamed: a
  kill mid-write leaves no truncated shard);
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
from pathlib import Path

from sglang_dspark.sglang_plugin.targets import PARALLEL

_RECORDERS: weakref.WeakSet = weakref.WeakSet()
RUN_ID_ENV = "SGLANG_DSPARK_STS_RUN_ID"
DURABLE_SECONDS = 10.0  # rows a SIGKILL may lose; each write rewrites the shard being filled (small)


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
            self._durable_at = time.monotonic()
            _RECORDERS.add(self)
            ref = weakref.ref(self)
            atexit.register(lambda: (recorder := ref()) is not None and recorder.flush())

        def record(self, **kwargs) -> None:
            if not self.writes:  # the other ranks of the group would write the same rows (and copy to host for it)
                return
            super().record(**kwargs)  # a full buffer is flushed in there, through flush() below
            if self._logits_buffer and time.monotonic() - self._durable_at >= DURABLE_SECONDS:
                self._save()  # the shard so far, under its final name: SIGKILL-proof, read once

        def flush(self) -> None:
            """SGLang's flush (the shard `<stem>.<count>.pt`, then the next count), written atomically."""
            if self._logits_buffer:
                self._save()
                self._logits_buffer.clear()
                self._prefix_mask_buffer.clear()
                self._shard_ct += 1

        def _save(self) -> None:
            import torch

            path = Path(f"{self.path_stem}.{self._shard_ct}.pt")  # StsDataRecorder.flush's name
            path.parent.mkdir(parents=True, exist_ok=True)
            tmp = path.with_name(path.name + ".tmp")  # outside the fit tool's `STEM.*.pt` glob
            torch.save({"logits": torch.cat(self._logits_buffer, dim=0),
                        "prefix_mask": torch.cat(self._prefix_mask_buffer, dim=0)}, tmp)
            os.replace(tmp, path)
            self._durable_at = time.monotonic()

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
