"""Tell the profile files a user passes apart: SPS step-time tables vs STS confidence calibrations.

TODO(profile bundles): a single profile file that carries both is another issue; until then each
`--profile` is one SGLang-format JSON file, recognised by its keys.
"""

from __future__ import annotations

import json
from pathlib import Path

SPS_KEYS = ("sample_batch_tokens", "bias_seconds")  # SpsCostTable, SpsAdditiveCostTable
STS_KEYS = ("temperatures",)


def split_profiles(paths: list[str]) -> tuple[str | None, str | None]:
    """(sps_path, sts_path) from the given files; ValueError with a one-line reason otherwise."""
    found: dict[str, str] = {}
    for path in paths:
        try:
            data = json.loads(Path(path).read_text())
        except (OSError, ValueError) as exc:
            raise ValueError(f"profile {path}: cannot read JSON ({exc})") from None
        keys = data.keys() if isinstance(data, dict) else ()
        kind = "sps" if any(k in keys for k in SPS_KEYS) else "sts" if any(k in keys for k in STS_KEYS) else None
        if kind is None:
            raise ValueError(f"profile {path}: neither an SPS table ({' or '.join(SPS_KEYS)}) nor an STS file (temperatures)")
        if kind in found:
            raise ValueError(f"profile {path}: a second {kind.upper()} file (first: {found[kind]})")
        found[kind] = str(path)
    return found.get("sps"), found.get("sts")
