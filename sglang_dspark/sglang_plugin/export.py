"""The learned table, written to the plugin's export directory (`SGLANG_DSPARK_EXPORT_DIR`, settings.py, which
the launcher sets to the directory it exported the profile's SPS / STS JSON to) at most every
EXPORT_SECONDS, so `profile snapshot --from-dir DIR` can keep what SGLang learned: SGLang's
/server_info does not report it, as the reference server's does.

One file per learning scheduler process, `learned-sps.dp<rank>.json` (learning runs on one
attention-TP rank only; each DP rank learns its own), replaced atomically, in the shape of the
reference server's `dspark_info_record` (the keys `profile snapshot` reads) plus the profile's
fingerprint (profile/learned.py). Written by whoever fitted the table, the fit worker or the
fallback thread: never the scheduler thread.
"""

from __future__ import annotations

import json
import logging
import os
import time
from pathlib import Path

from sglang_dspark.profile.learned import KIND, learned_path  # noqa: F401 - the file's format lives there

logger = logging.getLogger(__name__)

EXPORT_SECONDS = 60.0


def step_times_ms(samples) -> list:
    """[[R, B, [ms, ...]], ...] as the reference server reports them (OnlineSpsEstimator.step_times
    over a snapshot): drafted steps with B > R, undrafted ones with B = R."""
    out: dict[tuple[int, int], list[float]] = {}
    for s in samples:
        if s.drafted == (s.batch_tokens > s.num_requests):
            out.setdefault((s.num_requests, s.batch_tokens), []).append(round(s.seconds * 1e3, 4))
    return [[r, b, times] for (r, b), times in sorted(out.items())]


class Exporter:
    """Writes the table it is given to `path` when EXPORT_SECONDS have passed since its last write
    (or none was written yet). `meta`: what the record carries besides the table (fingerprint,
    STS temperatures, max batch tokens, DP rank), JSON-ready."""

    def __init__(self, path: str | Path, meta: dict, every: float = EXPORT_SECONDS, clock=time.monotonic):
        self.path, self.meta, self.every, self.clock = Path(path), meta, every, clock
        self.last: float | None = None

    def maybe_write(self, table, samples, steps: int) -> bool:
        """`write` when EXPORT_SECONDS have passed since the last write (or there was none)."""
        now = self.clock()
        if self.last is not None and now - self.last < self.every:
            return False
        if not self.write(table, samples, steps):
            return False
        self.last = now
        return True

    def write(self, table, samples, steps: int) -> bool:
        """Write the record now (the scheduler's shutdown); False when there is nothing worth keeping."""
        if table is None or not any(s.drafted for s in samples):
            return False  # a table that never saw a drafted step prices drafting as prohibitive
        sps = table.table.model_dump(mode="json")
        sps["draft_skip_seconds"] = table.draft_skip_seconds
        record = {"kind": KIND, **self.meta, "written_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
                  "steps": steps, "sps_source": "profile+online", "sps": sps,
                  "sps_drafted_samples": sum(s.drafted for s in samples), "sps_step_times_ms": step_times_ms(samples)}
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            tmp = self.path.with_name(f".{self.path.name}.{os.getpid()}.tmp")
            tmp.write_text(json.dumps(record) + "\n")
            os.replace(tmp, self.path)  # a reader sees the last whole file, never half of one
        except Exception:  # noqa: BLE001 - a file not written never costs the fit its table
            logger.exception("could not write the learned SPS table to %s", self.path)
            return False
        return True
