"""`capture-http`: measure SPS(B) of a running server over HTTP and write an SLA profile.

Works against our server and against SGLang started with
`SGLANG_RAGGED_VERIFY_MODE=static SGLANG_DSPARK_ENABLE_SPS_RECORD=1` (SGLANG.md). For each forced
budget fraction f (`POST /set_internal_state {"server_args": {"dspark_force_budget_frac": f}}`) and
each concurrency c, it runs c concurrent `/generate` requests (`ignore_eos`, a fixed
`max_new_tokens`), then reads the per-step records from `GET /server_info`
(`internal_states[0].dspark_info_record.records[i]`: `bs`, `num_verify_tokens` and the step time).
Records are keyed by what they report, so the mix of batch sizes a level happens to produce is
fine. Per (bs, batch_tokens) the median / p10 / p90 step time become `sps.measurements`; per
batch_tokens the median over all requests counts becomes the 1-D cost table (SPS = 1000 /
median ms). Every loop is bounded: a fixed number of levels, requests and HTTP timeouts.
"""

from __future__ import annotations

import json
import logging
import socket
import statistics
import urllib.error
import urllib.request
from collections import defaultdict
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from sglang_dspark.core.sps import SpsCostTable
from sglang_dspark.profiles import (
    ENGINES,
    SCHEMA_VERSION,
    Fingerprint,
    Measurement,
    ProfileError,
    Provenance,
    SlaProfile,
    SlaTier,
    SpsSection,
    _versions,
    dir_sha256,
    draft_gamma,
    hardware_id,
    utc_now,
)

logger = logging.getLogger(__name__)

STEP_FIELDS = ("step_ms", "step_gpu_ms", "step_cpu_ms")  # ours; SGLang's records
DEFAULT_FRACTIONS = (0.125, 0.25, 0.5, 0.75, 1.0)  # SGLang refuses 0: the range is (0, 1]
DEFAULT_CONCURRENCIES = (1, 2, 4, 8)
UNKNOWN_HASH = "unknown"


class HttpClient:
    def __init__(self, base_url: str, timeout: float = 120.0):
        self.base_url = base_url.rstrip("/")
        self.timeout = timeout

    def _call(self, method: str, path: str, body: dict | None = None) -> dict:
        data = None if body is None else json.dumps(body).encode()
        req = urllib.request.Request(self.base_url + path, data=data, method=method,
                                     headers={"Content-Type": "application/json"} if data else {})
        try:
            with urllib.request.urlopen(req, timeout=self.timeout) as resp:
                raw = resp.read()
        except urllib.error.HTTPError as exc:
            detail = exc.read().decode(errors="replace")[:300]
            raise ProfileError(f"{method} {self.base_url}{path}: HTTP {exc.code}: {' '.join(detail.split())}") from None
        except (urllib.error.URLError, socket.timeout, OSError) as exc:
            raise ProfileError(f"{method} {self.base_url}{path}: {getattr(exc, 'reason', exc)}") from None
        try:
            return json.loads(raw) if raw.strip() else {}
        except ValueError:
            raise ProfileError(f"{method} {self.base_url}{path}: the answer is not JSON") from None

    def get(self, path: str) -> dict:
        return self._call("GET", path)

    def post(self, path: str, body: dict) -> dict:
        return self._call("POST", path, body)


def _dspark_record(info: dict) -> dict:
    states = info.get("internal_states") or []
    rec = states[0].get("dspark_info_record") if states and isinstance(states[0], dict) else None
    if not isinstance(rec, dict):
        raise ProfileError("server_info: no internal_states[0].dspark_info_record; start SGLang with "
                           "SGLANG_DSPARK_ENABLE_SPS_RECORD=1 and --speculative-algorithm DSPARK")
    return rec


def _step_ms(record: dict, field: str | None) -> float | None:
    for name in (field,) if field else STEP_FIELDS:
        value = record.get(name)
        if isinstance(value, (int, float)) and value > 0:
            return float(value)
    return None


def _percentile(sorted_values: list[float], q: float) -> float:
    """Linear-interpolated percentile of an already sorted list (q in [0, 1])."""
    if len(sorted_values) == 1:
        return sorted_values[0]
    pos = q * (len(sorted_values) - 1)
    lo = int(pos)
    hi = min(lo + 1, len(sorted_values) - 1)
    return sorted_values[lo] + (pos - lo) * (sorted_values[hi] - sorted_values[lo])


def aggregate(records: list[dict], *, step_field: str | None = None, min_samples: int = 3,
              max_batch_tokens: int | None = None) -> tuple[SpsCostTable, list[Measurement]]:
    """Step records -> (1-D cost table, measurement rows). Probes with fewer than `min_samples`
    steps are dropped; ProfileError when nothing is left."""
    by_probe: dict[tuple[int, int], list[float]] = defaultdict(list)
    for r in records:
        ms = _step_ms(r, step_field)
        bs, tokens = r.get("bs"), r.get("num_verify_tokens")
        if ms is None or not isinstance(bs, int) or not isinstance(tokens, int) or bs < 1 or tokens < bs:
            continue
        by_probe[(bs, tokens)].append(ms)
    rows = []
    by_tokens: dict[int, list[float]] = defaultdict(list)
    for (bs, tokens), values in sorted(by_probe.items()):
        if len(values) < min_samples:
            continue
        values.sort()
        rows.append(Measurement(num_requests=bs, batch_tokens=tokens, median_ms=round(statistics.median(values), 4),
                                p10_ms=round(_percentile(values, 0.1), 4), p90_ms=round(_percentile(values, 0.9), 4),
                                repeats=len(values)))
        by_tokens[tokens].extend(values)
    if not rows:
        raise ProfileError(f"no probe has {min_samples} or more step records (got {len(records)} records); "
                           "drive more load or lower --min-samples")
    tokens = sorted(by_tokens)
    sps = [round(1000.0 / statistics.median(by_tokens[b]), 6) for b in tokens]
    cost = SpsCostTable(sample_batch_tokens=tokens, sample_steps_per_sec=sps,
                        max_batch_tokens=max(tokens[-1], max_batch_tokens or 0))
    return cost, rows


def _generate(client: HttpClient, prompt: str, max_new_tokens: int, seed: int) -> None:
    client.post("/generate", {"text": prompt, "sampling_params": {
        "max_new_tokens": max_new_tokens, "temperature": 0.0, "ignore_eos": True}})


def drive_load(client: HttpClient, *, fractions, concurrencies, max_new_tokens: int, prompt: str,
               warmup_steps: int, max_concurrency: int | None) -> list[dict]:
    """Run every (fraction, concurrency) level; return the step records they produced."""
    records: list[dict] = []
    counter = 0
    try:
        for frac in fractions:
            answer = client.post("/set_internal_state", {"server_args": {"dspark_force_budget_frac": frac}})
            if answer.get("updated") is False:
                raise ProfileError(f"/set_internal_state: the server refused dspark_force_budget_frac={frac}")
            for conc in concurrencies:
                conc = min(conc, max_concurrency) if max_concurrency else conc
                cleared = client.post("/set_internal_state", {"server_args": {"dspark_clear_info_records": True}})
                start = 0 if cleared.get("updated") is not False else len(_dspark_record(client.get("/server_info")).get("records") or [])
                with ThreadPoolExecutor(max_workers=conc) as pool:
                    futures = [pool.submit(_generate, client, prompt, max_new_tokens, counter + i) for i in range(conc)]
                    for f in futures:
                        f.result()
                counter += conc
                level = list(_dspark_record(client.get("/server_info")).get("records") or [])[start:]
                logger.info("budget frac %s, %d concurrent: %d step records", frac, conc, len(level))
                records.extend(level[warmup_steps:])
    finally:
        try:
            client.post("/set_internal_state", {"server_args": {"dspark_force_budget_frac": None}})
        except ProfileError as exc:
            logger.warning("could not hand the budget back to the planner: %s", exc)
    return records


def parse_tier(text: str) -> SlaTier:
    """NAME:TOK_S_PER_USER:TTFT_S:MAX_CONCURRENCY, e.g. interactive:20:2:4."""
    parts = text.split(":")
    if len(parts) != 4:
        raise ProfileError(f"--tier {text}: expected NAME:TOK_S_PER_USER:TTFT_S:MAX_CONCURRENCY")
    try:
        return SlaTier(name=parts[0], tok_s_per_user=float(parts[1]), ttft_s=float(parts[2]),
                       max_concurrency=int(parts[3]))
    except ValueError as exc:
        raise ProfileError(f"--tier {text}: {exc}") from None


def capture_http(base_url: str, *, name: str, model: str | None = None, draft: str | None = None,
                 fractions=DEFAULT_FRACTIONS, concurrencies=DEFAULT_CONCURRENCIES, max_new_tokens: int = 32,
                 prompt: str = "Write a short story about a lighthouse keeper.", warmup_steps: int = 1,
                 min_samples: int = 3, step_field: str | None = None, tiers=(), hardware: str | None = None,
                 command: str = "", timeout: float = 120.0) -> SlaProfile:
    """Drive load against `base_url` and build the profile (not saved)."""
    if not fractions or any(not 0.0 <= f <= 1.0 for f in fractions):
        raise ProfileError(f"--fractions: need values in [0, 1], got {list(fractions)}")
    if not concurrencies or any(c < 1 for c in concurrencies):
        raise ProfileError(f"--concurrency: need values >= 1, got {list(concurrencies)}")
    client = HttpClient(base_url, timeout)
    info = client.get("/server_info")
    rec = _dspark_record(info)
    gamma = int(rec.get("gamma") or 0) or (int(info.get("speculative_num_draft_tokens") or 1) - 1)
    if gamma < 1 and draft and Path(draft).is_dir():
        gamma = draft_gamma(draft)
    if gamma < 1:
        raise ProfileError("server_info: the server does not speculate (gamma 0); start it with a drafter")
    engine = info.get("engine") if info.get("engine") in ENGINES else "sglang"
    max_running = info.get("max_running_requests")
    records = drive_load(client, fractions=fractions, concurrencies=concurrencies, max_new_tokens=max_new_tokens,
                         prompt=prompt, warmup_steps=warmup_steps,
                         max_concurrency=max_running if isinstance(max_running, int) else None)
    cost, rows = aggregate(records, step_field=step_field, min_samples=min_samples,
                           max_batch_tokens=max_running * (gamma + 1) if isinstance(max_running, int) else None)
    hashes = {}
    for key, d in (("target_sha256", model), ("draft_sha256", draft)):
        if d is None:
            logger.warning("no %s given: the profile's %s is %r, so launch --profile will refuse it "
                           "without --force-profile", "--model" if key.startswith("target") else "--draft", key,
                           UNKNOWN_HASH)
            hashes[key] = UNKNOWN_HASH
        else:
            hashes[key] = dir_sha256(d)
    torch_version, sglang_version = _versions()
    fp = Fingerprint(engine=engine, hardware=hardware or hardware_id(), torch=torch_version, sglang=sglang_version,
                     tp=int(info.get("tp_size") or 1), dp=int(info.get("dp_size") or 1), gamma=gamma, **hashes)
    repeats = min(r.repeats for r in rows)
    return SlaProfile(
        version=SCHEMA_VERSION, name=name, fingerprint=fp, sps=SpsSection(cost=cost, measurements=rows),
        sla_tiers=list(tiers),
        provenance=Provenance(command=command, date=utc_now(), repeats=repeats, warmup=warmup_steps,
                              host=socket.gethostname()))


def add_capture_http_parser(subparsers) -> None:
    p = subparsers.add_parser(
        "capture-http", help="measure a running server over HTTP and write a profile",
        description=__doc__.split("\n\n")[0] + " Needs a server that records DSpark steps "
                    "(ours, or SGLang with SGLANG_RAGGED_VERIFY_MODE=static SGLANG_DSPARK_ENABLE_SPS_RECORD=1).")
    p.add_argument("--base-url", required=True, help="the server, e.g. http://127.0.0.1:30000")
    p.add_argument("--out", required=True, type=Path, help="profile YAML to write")
    p.add_argument("--name", help="profile name (default: the --out file name without extension)")
    p.add_argument("--model", metavar="DIR", help="the server's target model directory, hashed into the fingerprint "
                                                  "(without it the hash is 'unknown' and launch refuses the profile "
                                                  "unless --force-profile)")
    p.add_argument("--draft", metavar="DIR", help="the server's drafter directory, hashed into the fingerprint")
    p.add_argument("--fractions", type=_floats, default=list(DEFAULT_FRACTIONS), metavar="F,F,...",
                   help="forced verify-budget fractions of requests * gamma to sweep (SGLang accepts (0, 1])")
    p.add_argument("--concurrency", type=_ints, default=list(DEFAULT_CONCURRENCIES), metavar="N,N,...",
                   help="concurrent requests per level (clamped to the server's max_running_requests)")
    p.add_argument("--max-new-tokens", type=int, default=32, help="tokens generated per request (ignore_eos)")
    p.add_argument("--prompt", default="Write a short story about a lighthouse keeper.", help="prompt text of every request")
    p.add_argument("--warmup-steps", type=int, default=1, help="step records dropped at the start of each level")
    p.add_argument("--min-samples", type=int, default=3, help="steps a (bs, batch_tokens) probe needs to be kept")
    p.add_argument("--step-field", choices=STEP_FIELDS, help="record field with the step time "
                                                            "(default: the first present of " + ", ".join(STEP_FIELDS) + ")")
    p.add_argument("--tier", action="append", default=[], metavar="NAME:TOK_S:TTFT_S:MAX_CONC",
                   help="an SLA tier to record in the profile; repeatable")
    p.add_argument("--hardware", help="hardware string for the fingerprint when the server is not on this machine "
                                      "(default: this machine's hardware_id())")
    p.add_argument("--timeout", type=float, default=120.0, help="seconds per HTTP request")
    p.set_defaults(func=run_capture_http)


def _floats(text: str) -> list[float]:
    return [float(x) for x in text.split(",") if x.strip()]


def _ints(text: str) -> list[int]:
    return [int(x) for x in text.split(",") if x.strip()]


def run_capture_http(args) -> int:
    import shlex
    import sys

    profile = capture_http(
        args.base_url, name=args.name or args.out.stem, model=args.model, draft=args.draft, fractions=args.fractions,
        concurrencies=args.concurrency, max_new_tokens=args.max_new_tokens, prompt=args.prompt,
        warmup_steps=args.warmup_steps, min_samples=args.min_samples, step_field=args.step_field,
        tiers=[parse_tier(t) for t in args.tier], hardware=args.hardware, timeout=args.timeout,
        command=" ".join(shlex.quote(a) for a in [sys.executable, "-m", "sglang_dspark.profile", *sys.argv[1:]]))
    profile.save(args.out)
    print(f"wrote {args.out}: {profile.summary()}")
    return 0
