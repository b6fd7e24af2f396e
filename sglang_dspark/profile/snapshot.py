"""`profile snapshot`: the SPS table a server learned, written as an SLA profile.

The reference server learns its table online (core/sps_online.py) and reports it in `/server_info`
with the recent step times it came from and its own fingerprint (`--base-url`). SGLang with the
plugin's learning on writes the same record to its export directory instead (`--from-dir`:
profile/learned.py), with the fingerprint of the profile it was launched with. A snapshot
keeps that: the fleet ships what its servers learned, and the next launch on the same hardware
starts from it.
"""

from __future__ import annotations

import socket

from pydantic import ValidationError

from sglang_dspark.core.calibration import StsCalibration
from sglang_dspark.core.schema import error_line
from sglang_dspark.core.sps import SpsAdditiveCostTable
from sglang_dspark.core.sps_fit import fit_cost_table
from sglang_dspark.profile.http_capture import ServerClient, dspark_record
from sglang_dspark.profile.learned import FILE_GLOB, read_learned
from sglang_dspark.profile.measure import summarize
from sglang_dspark.profile.schema import (SCHEMA_VERSION, Fingerprint, ProfileError, Provenance, SlaProfile,
                                          SpsSection, utc_now)


def snapshot(base_url: str, *, name: str, tiers=(), command: str = "", timeout: float = 30.0,
             api_key: str | None = None, min_samples: int = 1) -> SlaProfile:
    """The profile of what the server at `base_url` learned (not saved)."""
    client = ServerClient(base_url, timeout, api_key)
    try:
        info = client.call("GET", "/server_info")
    finally:
        client.close()
    rec = dspark_record(info)
    if rec.get("sps_source") not in ("online", "seeded+online", "profile+online"):
        raise ProfileError(f"{base_url}: the server does not learn its SPS table (source {rec.get('sps_source')!r}); "
                           "start it with python -m sglang_dspark.launch --mode scheduled --sps-learning on")
    if not rec.get("sps_drafted_samples"):
        raise ProfileError(f"{base_url}: the server has not measured a drafted step yet; drive some load first")
    try:
        fingerprint = Fingerprint.model_validate(info.get("dspark_fingerprint") or {})
    except ValidationError as exc:
        raise ProfileError(f"{base_url}: server_info.dspark_fingerprint: {error_line(exc)} (a server started by "
                           "python -m sglang_dspark.launch with a drafter reports it)") from None
    max_tokens = int(info.get("max_running_requests") or 1) * (fingerprint.gamma + 1)
    return _profile(rec, fingerprint, max_tokens, base_url, name=name, tiers=tiers, command=command,
                    min_samples=min_samples)


def snapshot_from_dir(directory, *, name: str, tiers=(), command: str = "", min_samples: int = 1) -> SlaProfile:
    """The profile of the table an SGLang worker learned and wrote to `directory` (its newest file
    when several DP ranks wrote one; not saved)."""
    try:
        records = read_learned(directory)
    except (OSError, ValueError) as exc:
        raise ProfileError(f"{directory}: {exc}") from None
    if not records:
        raise ProfileError(f"{directory}: no {FILE_GLOB} here; SGLang writes it there, once a minute, when launched "
                           "with --sps-learning on (SGLANG_DSPARK_EXPORT_DIR, the launcher's --export-dir)")
    rec = records[0]
    origin = rec["path"]
    if not rec.get("dspark_fingerprint"):
        raise ProfileError(f"{origin}: no fingerprint (the worker ran without SGLANG_DSPARK_PROFILE): a profile "
                           "needs the fingerprint of the deployment it was measured on")
    fingerprint = Fingerprint.model_validate(rec["dspark_fingerprint"])
    times = [b for _, b, _ in rec.get("sps_step_times_ms") or []]
    max_tokens = int(rec.get("max_batch_tokens") or max(times, default=1))
    return _profile(rec, fingerprint, max_tokens, origin, name=name, tiers=tiers, command=command,
                    min_samples=min_samples)


def _profile(rec: dict, fingerprint: Fingerprint, max_tokens: int, origin: str, *, name: str, tiers, command: str,
             min_samples: int) -> SlaProfile:
    table = dict(rec["sps"])
    skip = table.pop("draft_skip_seconds", None)
    samples = {(int(r), int(b)): times for r, b, times in rec.get("sps_step_times_ms") or []}
    rows = summarize(samples, min_samples=min_samples)
    if not rows:
        raise ProfileError(f"{origin}: no step times reported; drive some load first")
    cost = fit_cost_table([m.batch_tokens for m in rows], [m.median_ms / 1e3 for m in rows], max_tokens)
    section = SpsSection(cost=cost, additive=SpsAdditiveCostTable.model_validate(table), draft_skip_seconds=skip,
                         measurements=rows)
    sts = rec.get("sts_temperatures")
    return SlaProfile(
        version=SCHEMA_VERSION, name=name, fingerprint=fingerprint, sps=section, sla_tiers=list(tiers),
        sts=StsCalibration(temperatures=sts, dataset=f"carried over from {origin}") if sts else None,
        provenance=Provenance(command=command, date=utc_now(), repeats=min(m.repeats for m in rows), warmup=0,
                              host=socket.gethostname(), source="snapshot"))
