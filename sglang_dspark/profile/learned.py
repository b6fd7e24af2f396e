"""The file an SGLang worker learning its SPS table writes (sglang_plugin/export.py) and
`profile snapshot --from-dir` reads: `learned-sps.dp<rank>.json`, the reference server's
`dspark_info_record` keys plus the profile's fingerprint."""

from __future__ import annotations

import json
from pathlib import Path

FILE_GLOB = "learned-sps.dp*.json"
KIND = "sglang_dspark learned SPS table"


def learned_path(directory: str | Path, dp_rank: int) -> Path:
    return Path(directory) / f"learned-sps.dp{dp_rank}.json"


def read_learned(directory: str | Path) -> list[dict]:
    """Every learned-table record in `directory`, newest first (each with its `path`)."""
    records = []
    for path in sorted(Path(directory).glob(FILE_GLOB)):
        record = json.loads(path.read_text())
        if record.get("kind") == KIND:
            records.append({**record, "path": str(path)})
    return sorted(records, key=lambda r: r.get("written_at", ""), reverse=True)
