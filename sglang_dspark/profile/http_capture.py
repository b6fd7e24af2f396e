"""`capture-http`: measure SPS(B) of a running server over HTTP and write an SLA profile.

Works against our server and against SGLang started the way `launch --engine sglang
--profile-capture` prints, in two phases. SGLang's static verify builds no budget planner, so a
forced fraction does nothing there and every step verifies bs * (gamma + 1) tokens: R and B rise
together and an additive fit cannot tell alpha(R) from theta(B). So phase 1 (`--phase static`,
static verify) measures that diagonal and writes the 1-D cost table only; phase 2 (`--phase
compact`, the default) runs against SGLang restarted in compact mode with the phase-1 table (compact
mode without a table verifies everything) and sweeps forced fractions, which gives the off-diagonal
(R, B) points the additive table needs. Records that lie on the diagonal only are refused for an
additive fit, saying why.

For each forced budget fraction f (`POST /set_internal_state {"server_args":
{"dspark_force_budget_frac": f}}`) and each concurrency c, it runs c concurrent `/generate`
requests (`ignore_eos`, a fixed `max_new_tokens`), then reads the per-step records from `GET
/server_info` (`internal_states[0].dspark_info_record.records[i]`: `bs`, `num_verify_tokens` and
the step time). Records are keyed by what they report, so the mix of batch sizes a level happens
to produce is fine. The default concurrencies reach the largest tier's max_concurrency (served
batches outside the measured range would be priced at its edge). Every loop is bounded: a fixed
number of levels, requests and HTTP timeouts.

Everything that can be checked before the sweep is (the flags, `--model` / `--draft` hashed, the
server reachable and recording), so a bad input fails in seconds rather than after the load. The
fingerprint's torch / SGLang versions are the server's where its /server_info reports them (SGLang's
"version"; our reference server's `dspark_fingerprint`), else this client's, with a warning.
"""

from __future__ import annotations

import logging
import socket
from collections import defaultdict
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx

from sglang_dspark.profile.fingerprint import dir_sha256, draft_gamma, fingerprint_for, library_versions
from sglang_dspark.profile.measure import fit_section, summarize
from sglang_dspark.profile.schema import (
    ENGINES, SCHEMA_VERSION, Fingerprint, ProfileError, Provenance, SlaProfile, utc_now,
)

logger = logging.getLogger(__name__)

STEP_FIELDS = ("step_ms", "step_gpu_ms", "step_cpu_ms")  # ours; SGLang's records
DEFAULT_FRACTIONS = (0.125, 0.25, 0.5, 0.75, 1.0)  # SGLang refuses 0: the range is (0, 1]
DEFAULT_CONCURRENCIES = (1, 2, 4, 8)
PHASES = ("static", "compact")
UNKNOWN_HASH = "unknown"


def concurrencies_for(tiers) -> tuple[int, ...]:
    """Powers of two up to the largest tier's max_concurrency, and that value itself (at least the
    defaults): every batch a tier admits lies inside the measured range."""
    top = max([t.max_concurrency for t in tiers] + [DEFAULT_CONCURRENCIES[-1]])
    levels = [c for c in (2 ** i for i in range(top.bit_length())) if c < top]
    return (*levels, top)


def diagonal_only(rows, gamma: int) -> bool:
    """True when every probe verifies every draft (B = R * (gamma + 1)): SGLang's static verify."""
    return all(m.batch_tokens == m.num_requests * (gamma + 1) for m in rows)


class ServerClient:
    """JSON over HTTP with one-line errors (ProfileError) for every way a call can fail."""

    def __init__(self, base_url: str, timeout: float = 120.0, api_key: str | None = None):
        headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self.base_url = base_url.rstrip("/")
        self._http = httpx.Client(base_url=self.base_url, timeout=timeout, headers=headers)

    def call(self, method: str, path: str, body: dict | None = None) -> dict:
        try:
            resp = self._http.request(method, path, json=body)
        except httpx.HTTPError as exc:
            raise ProfileError(f"{method} {self.base_url}{path}: {type(exc).__name__}: {exc}") from None
        if resp.status_code >= 400:
            raise ProfileError(f"{method} {self.base_url}{path}: HTTP {resp.status_code}: {' '.join(resp.text[:300].split())}")
        try:
            return resp.json() if resp.content.strip() else {}
        except ValueError:
            raise ProfileError(f"{method} {self.base_url}{path}: the answer is not JSON") from None

    def set_state(self, **server_args) -> list[bool]:
        """SGLang's runtime knobs. SGLang 0.5.23 answers with one bool per DP rank's scheduler
        (`TokenizerControlMixin.set_internal_state`), false where that rank refused; anything but a
        non-empty list of trues is refused here, since records of a level whose budget some rank
        did not take would be fitted as that budget's."""
        answer = self.call("POST", "/set_internal_state", {"server_args": server_args})
        if isinstance(answer, list) and answer and all(a is True for a in answer):
            return answer
        if isinstance(answer, list) and answer:
            refused = [i for i, a in enumerate(answer) if a is not True]
            raise ProfileError(f"/set_internal_state: DP rank(s) {refused} of {len(answer)} refused {server_args} "
                               "(SGLang logs why: 'Updating ... is rejected' / 'requires a DSpark draft worker')")
        raise ProfileError(f"/set_internal_state: expected SGLang's answer, a list of one bool per DP rank, got "
                           f"{str(answer)[:200]} for {server_args}")

    def close(self) -> None:
        self._http.close()


def dspark_record(info: dict) -> dict:
    states = info.get("internal_states") or []
    rec = states[0].get("dspark_info_record") if states and isinstance(states[0], dict) else None
    if not isinstance(rec, dict):
        raise ProfileError("server_info: no internal_states[0].dspark_info_record; start SGLang with "
                           "SGLANG_DSPARK_ENABLE_SPS_RECORD=1 and --speculative-algorithm DSPARK "
                           "(python -m sglang_dspark.launch --engine sglang --profile-capture does)")
    return rec


def model_dir_sha256(flag: str, path: str) -> str:
    """The content hash of a model directory given as `flag`, refused by name when it is not one
    (a hub id, a typo): checked before any load is driven."""
    p = Path(path)
    if not p.is_dir():
        raise ProfileError(f"{flag} {path}: not a local directory (a hub id cannot be hashed: give the directory "
                           "the server loaded)")
    if not (p / "config.json").is_file():
        raise ProfileError(f"{flag} {path}: no config.json, not a model directory")
    try:
        return dir_sha256(p)
    except OSError as exc:
        raise ProfileError(f"{flag} {path}: cannot read ({exc.strerror or exc})") from None


def server_versions(info: dict, engine: str) -> tuple[str, str | None]:
    """(torch, sglang) versions of the server: SGLang's /server_info reports its own "version" (not
    torch's); our reference server reports both in `dspark_fingerprint` when launched with a drafter.
    What the server does not report is this client's, with a warning: the server may run others."""
    client_torch, client_sglang = library_versions()
    reported = info.get("dspark_fingerprint") if isinstance(info.get("dspark_fingerprint"), dict) else {}
    torch_version = reported.get("torch") if isinstance(reported.get("torch"), str) else None
    if engine == "sglang" and isinstance(info.get("version"), str):
        sglang_version, sglang_known = info["version"], True
    elif "sglang" in reported and (reported["sglang"] is None or isinstance(reported["sglang"], str)):
        sglang_version, sglang_known = reported["sglang"], True
    else:
        sglang_version, sglang_known = client_sglang, False
    if torch_version is None:
        torch_version = client_torch
        logger.warning("the server's /server_info reports no torch version: the fingerprint records this "
                       "client's (torch %s); correct fingerprint.torch if the server runs another", client_torch)
    if not sglang_known:
        logger.warning("the server's /server_info reports no SGLang version: the fingerprint records this "
                       "client's (sglang %s); correct fingerprint.sglang if the server runs another", client_sglang)
    return torch_version, sglang_version


def step_samples(records: list[dict], step_field: str | None = None) -> dict[tuple[int, int], list[float]]:
    """Step times (ms) keyed by (bs, num_verify_tokens); malformed records are skipped."""
    samples: dict[tuple[int, int], list[float]] = defaultdict(list)
    for r in records:
        ms = next((float(r[f]) for f in ((step_field,) if step_field else STEP_FIELDS)
                   if isinstance(r.get(f), (int, float)) and r[f] > 0), None)
        bs, tokens = r.get("bs"), r.get("num_verify_tokens")
        if ms is None or not isinstance(bs, int) or not isinstance(tokens, int) or bs < 1 or tokens < bs:
            continue
        samples[(bs, tokens)].append(ms)
    return samples


def drive_load(client: ServerClient, *, fractions, concurrencies, max_new_tokens: int, prompt: str,
               warmup_steps: int, max_concurrency: int | None) -> list[dict]:
    """Run every (fraction, concurrency) level; return the step records they produced."""
    records: list[dict] = []

    def generate(_: int) -> None:
        client.call("POST", "/generate", {"text": prompt, "sampling_params": {
            "max_new_tokens": max_new_tokens, "temperature": 0.0, "ignore_eos": True}})

    try:
        for frac in fractions:
            client.set_state(dspark_force_budget_frac=frac)
            for conc in concurrencies:
                conc = min(conc, max_concurrency) if max_concurrency else conc
                client.set_state(dspark_clear_info_records=True)
                with ThreadPoolExecutor(max_workers=conc) as pool:
                    list(pool.map(generate, range(conc)))
                level = list(dspark_record(client.call("GET", "/server_info")).get("records") or [])
                logger.info("budget frac %s, %d concurrent: %d step records", frac, conc, len(level))
                records.extend(level[warmup_steps:])
    finally:
        try:
            client.set_state(dspark_force_budget_frac=None)
        except ProfileError as exc:
            logger.warning("could not hand the budget back to the planner: %s", exc)
    return records


def capture_http(base_url: str, *, name: str, model: str | None = None, draft: str | None = None,
                 fractions=DEFAULT_FRACTIONS, concurrencies=None, phase: str = "compact", max_new_tokens: int = 32,
                 prompt: str = "Write a short story about a lighthouse keeper.", warmup_steps: int = 1,
                 min_samples: int = 3, step_field: str | None = None, tiers=(), hardware: str | None = None,
                 command: str = "", timeout: float = 120.0, api_key: str | None = None) -> SlaProfile:
    """Drive load against `base_url` and build the profile (not saved). `concurrencies` None: from
    the tiers (concurrencies_for)."""
    if phase not in PHASES:
        raise ProfileError(f"--phase {phase}: expected one of {', '.join(PHASES)}")
    if phase == "static":
        fractions = (1.0,)  # static verify checks every draft whatever the fraction: one level per concurrency
    concurrencies = concurrencies_for(tiers) if concurrencies is None else concurrencies
    if not fractions or any(not 0.0 < f <= 1.0 for f in fractions):
        raise ProfileError(f"--fractions: need values in (0, 1] (SGLang refuses 0), got {list(fractions)}")
    if not concurrencies or any(c < 1 for c in concurrencies):
        raise ProfileError(f"--concurrency: need values >= 1, got {list(concurrencies)}")
    for flag, value, low in (("--max-new-tokens", max_new_tokens, 1), ("--warmup-steps", warmup_steps, 0),
                             ("--min-samples", min_samples, 1)):
        if value < low:
            raise ProfileError(f"{flag} {value}: must be >= {low}")
    if not timeout > 0:
        raise ProfileError(f"--timeout {timeout}: must be > 0")
    # hashed now, not after the sweep: a hub id or a typo fails before minutes of load
    hashes = {flag: model_dir_sha256(flag, d) if d is not None else UNKNOWN_HASH
              for flag, d in (("--model", model), ("--draft", draft))}
    for flag, d in (("--model", model), ("--draft", draft)):
        if d is None:
            logger.warning("no %s given: the profile records its hash as %r, so launch --profile refuses it "
                           "without --force-profile", flag, UNKNOWN_HASH)
    client = ServerClient(base_url, timeout, api_key)
    try:
        info = client.call("GET", "/server_info")
        rec = dspark_record(info)
        gamma = int(rec.get("gamma") or 0) or (int(info.get("speculative_num_draft_tokens") or 1) - 1)
        if gamma < 1 and draft and Path(draft).is_dir():
            gamma = draft_gamma(draft)
        if gamma < 1:
            raise ProfileError("server_info: the server does not speculate (gamma 0); start it with a drafter")
        engine = info.get("engine") if info.get("engine") in ENGINES else "sglang"
        if engine == "sglang" and phase == "compact" and rec.get("mode") == "static":
            raise ProfileError(f"--phase compact: the server runs static verify ({base_url}), where forced "
                               "fractions do nothing; capture --phase static here, then restart it in compact mode "
                               "with that table (launch --engine sglang --profile-capture --profile PHASE1.yaml)")
        max_running = info.get("max_running_requests")
        max_running = max_running if isinstance(max_running, int) else None
        torch_version, sglang_version = server_versions(info, engine)
        records = drive_load(client, fractions=fractions, concurrencies=concurrencies, max_new_tokens=max_new_tokens,
                             prompt=prompt, warmup_steps=warmup_steps, max_concurrency=max_running)
    finally:
        client.close()
    rows = summarize(step_samples(records, step_field), min_samples=min_samples)
    if not rows:
        raise ProfileError(f"no probe has {min_samples} or more step records (got {len(records)} records); "
                           "drive more load or lower --min-samples")
    if phase == "compact" and diagonal_only(rows, gamma):
        raise ProfileError(f"every step record verified every draft (B = R * (gamma + 1), {len(rows)} probes): the "
                           "additive fit cannot tell alpha(R) from theta(B) on that diagonal and would price budget 0 "
                           "like a full verify. SGLang in static verify ignores forced fractions: write this as "
                           "--phase static, then capture --phase compact against SGLang restarted in compact mode "
                           "with that table")
    section = fit_section(rows, max_running * (gamma + 1) if max_running else 0,
                          skips_drafter_at_budget_0=engine == "reference", additive=phase == "compact")
    fp = fingerprint_for(engine=engine, target_dir=model, draft_dir=draft, gamma=gamma,
                         tp=int(info.get("tp_size") or 1), dp=int(info.get("dp_size") or 1), hardware=hardware,
                         target_sha256=hashes["--model"], draft_sha256=hashes["--draft"])
    fp = Fingerprint.model_validate({**fp.model_dump(), "torch": torch_version, "sglang": sglang_version})
    return SlaProfile(
        version=SCHEMA_VERSION, name=name, fingerprint=fp, sps=section, sla_tiers=list(tiers),
        provenance=Provenance(command=command, date=utc_now(), repeats=min(r.repeats for r in rows),
                              warmup=warmup_steps, host=socket.gethostname(), source="capture-http"))
