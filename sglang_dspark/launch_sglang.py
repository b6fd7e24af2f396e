"""The SGLang side of `launch`: the command and environment of a DSpark deployment on GPUs.

Mode -> SGLang: "target" runs plain SGLang (no speculation); "full" is DSpark with
`SGLANG_RAGGED_VERIFY_MODE=static` (verify every draft, scheduler off); "scheduled" is DSpark with
`compact` (ragged verify sized by the planner), which needs the profile's SPS table: without one
SGLang falls back to verify-all and ignores the planner, so the launcher refuses instead.

The bundle's plugin (sglang_dspark/sglang_plugin/) runs inside SGLang; the launcher configures it
by environment: `SGLANG_DSPARK_PROFILE` (the profile), `SGLANG_DSPARK_SLA_TIER`,
`SGLANG_DSPARK_SPS_LEARNING`. Beyond one node the same command runs on every node with its
`--node-rank`; replicas go behind `sglang-router` (launch/router/README.md).
"""

from __future__ import annotations

import hashlib
import json
import os
import shlex
import sys
from dataclasses import dataclass, field
from pathlib import Path

VERIFY_MODE = {"full": "static", "scheduled": "compact"}
SHIPPED_PLUGINS = ("smg-servicer", "smg-zmq")  # sglang's own; an allow-list must keep them
EXPORT_CACHE = Path("~/.cache/sglang_dspark/sglang")


class SglangLaunchError(ValueError):
    """A deployment that would not do what it says; the message is the one line the user sees."""


@dataclass(frozen=True)
class Deployment:
    model: str
    draft: str | None
    mode: str
    host: str = "127.0.0.1"
    port: int = 30000
    max_running: int | None = None
    max_queued: int | None = None
    max_len: int | None = None
    seed: int | None = None
    served_model_name: str | None = None
    api_key: str | None = None
    admin_api_key: str | None = None
    tool_call_parser: str | None = None
    tp: int = 1
    dp: int = 1
    nnodes: int = 1
    dist_init_addr: str | None = None
    gamma: int | None = None  # the drafter's block size
    profile_path: str | None = None  # a checked SLA profile (profile/resolve.py)
    sps_path: str | None = None  # its tables, exported for SGLang's own flags
    sts_path: str | None = None
    tier: object | None = None  # an SlaTier of the profile
    sps_learning: bool = False
    profile_capture: bool = False  # static verify with step records on, for `profile capture-http`
    user_plugins: str | None = None  # SGLANG_PLUGINS as the user had it
    measured_requests: int | None = None  # the profile's largest measured batch (requests per step)
    force_profile: bool = False  # serve a tier beyond what the profile measured anyway
    env_extra: dict = field(default_factory=dict)


@dataclass(frozen=True)
class NodeCommand:
    node_rank: int
    argv: list[str]
    env: dict[str, str]

    def render(self, hide_keys: bool = False) -> str:
        """Copy-pasteable: one `export` per variable, then the command on one line (API keys as
        '***' with `hide_keys`, for output that may land in a log)."""
        lines = [f"export {k}={shlex.quote(v)}" for k, v in sorted(self.env.items())]
        return "\n".join(lines + [shlex.join(hidden(self.argv) if hide_keys else self.argv)])


KEY_FLAGS = ("--api-key", "--admin-api-key")


def hidden(words: list[str]) -> list[str]:
    """`words` with the value after every key flag replaced by '***'."""
    return [("***" if i and words[i - 1] in KEY_FLAGS else w) for i, w in enumerate(words)]


def export_profile(profile, profile_file: str, out_dir: str | Path | None) -> tuple[str, str | None]:
    """SGLang's SPS (and STS) JSON from the profile, into `out_dir` or a cache directory named by the
    profile file's content, so relaunching reuses it and nothing is left in /tmp."""
    if out_dir is None:
        digest = hashlib.sha256(Path(profile_file).read_bytes()).hexdigest()[:16]
        out_dir = EXPORT_CACHE.expanduser() / digest
    sps, sts = profile.export_sglang(out_dir)
    return str(sps), None if sts is None else str(sts)


def capture_batch_sizes(max_running: int) -> list[int]:
    """Decode batch sizes to capture CUDA graphs for: 1, 2, 4, then every 8 up to max_running, and
    max_running itself (SGLang pads a batch to the next size, and a verify of R requests to the next
    size times gamma + 1 tokens)."""
    return sorted({s for s in (1, 2, 4, *range(8, max_running + 1, 8)) if s <= max_running} | {max_running})


def measured_requests(profile) -> int | None:
    """The most requests per step the profile's table was measured at (its measurements, else the
    additive table's last probe); None when it does not say."""
    if profile.sps.measurements:
        return max(m.num_requests for m in profile.sps.measurements)
    return profile.sps.additive.bs_probes[-1] if profile.sps.additive is not None else None


def check_coverage(d: Deployment) -> None:
    """A tier admitting more requests than the profile measured would have every larger step priced
    like the largest measured one (both lookups clamp), over-predicting per-user speed."""
    if d.tier is None or d.measured_requests is None or d.force_profile:
        return
    if d.tier.max_concurrency > d.measured_requests:
        raise SglangLaunchError(
            f"tier {d.tier.name!r} admits {d.tier.max_concurrency} requests but the profile measured at most "
            f"{d.measured_requests} per step, so larger steps would be priced as {d.measured_requests}-request "
            "steps; recapture with the tier (capture-http's default concurrencies reach its max_concurrency), "
            "or --force-profile")


def known_crash_guards(mode: str, tp: int) -> list[tuple[list[str], str]]:
    """SGLang flags the launcher adds to keep a deployment off a path SGLang 0.5.23 is known to crash
    on, each with the one line it prints. Compact verify under CUDA graphs with the overlap scheduler
    on several GPUs can hit an illegal memory access at a graph-size change (sglang#31023, reported at
    TP 4 and 8; the same workloads ran clean with overlap off), so a scheduled deployment with --tp > 1
    runs without overlap; `known_crash` refuses the command should it ever lack the flag."""
    if mode == "scheduled" and tp > 1:
        return [(["--disable-overlap-schedule"],
                 f"--tp {tp} with --mode scheduled: SGLang's overlap scheduler is turned off (--disable-overlap-schedule): "
                 "compact verify under CUDA graphs with overlap on crashes at graph-size changes on several GPUs "
                 "(sglang#31023)")]
    return []


def guard_notes(d: Deployment) -> list[str]:
    """What the launcher changed to keep `d` off a known crash, a line each (printed at launch)."""
    mode = {"static": "full", "compact": "scheduled"}.get(capture_phase(d), d.mode)
    return [note for _, note in known_crash_guards(mode, d.tp)]


def native_block_size(draft_dir: str | Path) -> int | None:
    """The block size SGLang 0.5.23's DSpark draft model runs a checkpoint at (its
    `parse_dspark_draft_config`: `dspark_block_size`, then `dflash_config.block_size`, then
    `block_size`); None when config.json names none or cannot be read. Mirrored rather than
    imported: importing SGLang's config module takes most of a minute."""
    try:
        config = json.loads((Path(draft_dir) / "config.json").read_text())
    except (OSError, ValueError):
        return None
    nested = config.get("dflash_config") if isinstance(config.get("dflash_config"), dict) else {}
    for value in (config.get("dspark_block_size"), nested.get("block_size"), config.get("block_size")):
        if value is not None:
            return int(value)
    return None


def _flag(argv: list[str], name: str) -> str | None:
    """The value after `name` in argv ("" for a bare flag), None when absent."""
    if name not in argv:
        return None
    i = argv.index(name)
    return argv[i + 1] if i + 1 < len(argv) and not argv[i + 1].startswith("--") else ""


def known_crash(argv: list[str], env: dict[str, str], draft: str | None = None) -> str | None:
    """Why SGLang 0.5.23 is known to crash on this DSpark command (one line), else None. It reads
    the command as written, so it holds whatever path built it."""
    if _flag(argv, "--speculative-algorithm") != "DSPARK":
        return None
    if (_flag(argv, "--disaggregation-mode") or "null") != "null":
        return ("PD disaggregation (--disaggregation-mode) with DSpark: SGLang's DSpark cookbooks do not support it; "
                "serve prefill and decode in one server")
    attn_dp = max(int(_flag(argv, f) or 1) for f in ("--attn-dp-size", "--attention-data-parallel-size"))
    if attn_dp > 1 or _flag(argv, "--enable-dp-attention") is not None:
        return ("DP attention with DSpark: SGLang's DSpark cookbooks do not support it (and compact verify under it "
                "refuses CUDA graphs); use --dp for data-parallel replicas")
    compact = env.get("SGLANG_RAGGED_VERIFY_MODE") == "compact"
    tp = int(_flag(argv, "--tp-size") or 1)
    if compact and tp > 1 and _flag(argv, "--disable-overlap-schedule") is None \
            and _flag(argv, "--disable-cuda-graph") is None:
        return (f"compact verify at --tp {tp} with CUDA graphs and the overlap scheduler on: illegal memory access "
                "at a graph-size change (sglang#31023); add --disable-overlap-schedule")
    passed, native = _flag(argv, "--speculative-dspark-block-size"), native_block_size(draft) if draft else None
    if compact and passed and native is not None and int(passed) != native:
        return (f"compact verify runs the drafter at its checkpoint's own block size {native} (config.json's "
                f"dspark_block_size / dflash_config.block_size come first) and ignores "
                f"--speculative-dspark-block-size {passed} (sglang#34023); make config.json's block sizes agree, "
                "or use --mode full")
    return None


def table_is_none_to_sglang(sps_path: str) -> bool:
    """Whether SGLang reads the exported table as uninitialized: a cost table of at most one probe
    (its `load_sps_table_from_path` takes a file naming `bias_seconds` as the additive table, and
    `is_uninitialized_sps_table` calls a cost table of <= 1 probe flat)."""
    text = Path(sps_path).read_text()
    return '"bias_seconds"' not in text and len(json.loads(text)["sample_batch_tokens"]) <= 1


def commands(d: Deployment) -> list[NodeCommand]:
    """One command per node (the same but for --node-rank)."""
    phase = capture_phase(d)
    if phase is None:
        check_coverage(d)
    mode = {"static": "full", "compact": "scheduled"}.get(phase, d.mode)
    if mode != "target" and d.draft is None:
        raise SglangLaunchError(f"mode {mode!r} needs a drafter (--draft)")
    if mode == "scheduled" and d.sps_path is None:
        raise SglangLaunchError("--mode scheduled on SGLang needs a profile for this deployment: compact verify without "
                                "an SPS table verifies every draft and ignores the planner. Capture one: launch with "
                                "--profile-capture, then run the printed `profile capture-http` command; or use --mode full")
    if mode == "scheduled" and phase is None and table_is_none_to_sglang(d.sps_path):
        raise SglangLaunchError("--mode scheduled: the profile's SPS table has one probe and no additive table, which "
                                "SGLang treats as no table (it verifies every draft, the scheduler and any SLA tier "
                                "are off); capture a full profile (--profile-capture), or use --mode full")
    argv = [sys.executable, "-m", "sglang.launch_server", "--model-path", d.model, "--host", d.host,
            "--port", str(d.port), "--enable-metrics"]
    env: dict[str, str] = dict(d.env_extra)
    if mode != "target":
        argv += ["--speculative-algorithm", "DSPARK", "--speculative-draft-model-path", d.draft]
        if d.gamma:
            argv += ["--speculative-dspark-block-size", str(d.gamma)]
        if d.sps_path and phase != "static":
            argv += ["--speculative-dspark-sps-table-path", d.sps_path]
        if d.sts_path and phase != "static":
            argv += ["--speculative-dspark-confidence-sts-path", d.sts_path]
        env["SGLANG_RAGGED_VERIFY_MODE"] = VERIFY_MODE[mode]
    if d.profile_capture:
        env["SGLANG_DSPARK_ENABLE_SPS_RECORD"] = "1"
    elif mode == "scheduled":
        env["SGLANG_DSPARK_PROFILE"] = str(d.profile_path)
        if d.tier is not None:
            env["SGLANG_DSPARK_SLA_TIER"] = d.tier.name
        if d.sps_learning:
            env["SGLANG_DSPARK_SPS_LEARNING"] = "1"
            # the learned table lands beside the exported profile, for `profile snapshot --from-dir`
            env["SGLANG_DSPARK_EXPORT_DIR"] = str(Path(d.sps_path).parent)
    if d.user_plugins:  # an allow-list: keep the user's, add ours and SGLang's own
        names = [n.strip() for n in d.user_plugins.split(",") if n.strip()]
        env["SGLANG_PLUGINS"] = ",".join(dict.fromkeys([*names, "sglang_dspark", *SHIPPED_PLUGINS]))
    max_running = d.max_running
    if d.tier is not None and mode == "scheduled" and phase is None:
        # SGLang has no SLA admission: the tier's concurrency caps the batch, shared by the --dp
        # replicas (each admits --max-running-requests of its own)
        share = max(1, d.tier.max_concurrency // d.dp)
        max_running = min(max_running or share, share)
    if max_running is not None:
        argv += ["--max-running-requests", str(max_running), "--cuda-graph-max-bs-decode", str(max_running)]
        if mode == "scheduled" and d.tier is not None and phase is None and d.gamma:
            # the graphs SGLang captures, named so the plugin's SLA decision prices the one a budget runs as
            sizes = capture_batch_sizes(max_running)
            argv += ["--cuda-graph-bs-decode", *map(str, sizes)]
            env["SGLANG_DSPARK_GRAPH_TOKENS"] = ",".join(str(bs * (d.gamma + 1)) for bs in sizes)
    for flag, value in (("--context-length", d.max_len), ("--max-queued-requests", d.max_queued), ("--random-seed", d.seed),
                        ("--served-model-name", d.served_model_name), ("--api-key", d.api_key),
                        ("--admin-api-key", d.admin_api_key), ("--tool-call-parser", d.tool_call_parser)):
        if value is not None:
            argv += [flag, str(value)]
    if d.tp > 1:
        argv += ["--tp-size", str(d.tp)]
    for flags, _ in known_crash_guards(mode, d.tp):
        argv += flags
    if d.dp > 1:
        argv += ["--dp-size", str(d.dp)]
    crash = known_crash(argv, env, d.draft)
    if crash is not None:
        raise SglangLaunchError(crash)
    if d.nnodes == 1:
        return [NodeCommand(0, argv, env)]
    if not d.dist_init_addr:
        raise SglangLaunchError(f"--nnodes {d.nnodes} needs --dist-init-addr HOST:PORT (node 0's address, reachable "
                                "from every node)")
    multi = argv + ["--nnodes", str(d.nnodes), "--dist-init-addr", d.dist_init_addr]
    return [NodeCommand(rank, multi + ["--node-rank", str(rank)], env) for rank in range(d.nnodes)]


def capture_phase(d: Deployment) -> str | None:
    """--profile-capture's phase: 1 ("static") without a profile, 2 ("compact") with the phase-1
    profile's table loaded (compact mode without a table verifies everything); None when serving."""
    if not d.profile_capture:
        return None
    return "compact" if d.sps_path else "static"


def capture_command(d: Deployment, out: str, hide_keys: bool = False, tiers=()) -> str:
    """What to run once a --profile-capture server is up (`tiers`: SlaTier, carried into the
    profile and reached by the default concurrencies)."""
    words = [sys.executable, "-m", "sglang_dspark.profile", "capture-http", "--base-url",
             f"http://{d.host}:{d.port}", "--out", out, "--phase", capture_phase(d) or "compact", "--model", d.model]
    if d.draft:
        words += ["--draft", d.draft]
    for t in tiers:
        words += ["--tier", f"{t.name}:{t.tok_s_per_user:g}:{t.ttft_s:g}:{t.max_concurrency}"]
    if d.admin_api_key or d.api_key:
        words += ["--api-key", d.admin_api_key or d.api_key]
    return shlex.join(hidden(words) if hide_keys else words)


def relaunch_command(d: Deployment, profile: str, hide_keys: bool = False) -> str:
    """Phase 2's launch: this deployment again, in compact mode with the phase-1 profile."""
    words = [sys.executable, "-m", "sglang_dspark.launch", "--engine", "sglang", "--model", d.model,
             "--profile-capture", "--profile", profile, "--host", d.host, "--port", str(d.port)]
    if d.draft:
        words += ["--draft", d.draft]
    for flag, value in (("--max-running", d.max_running), ("--max-len", d.max_len), ("--api-key", d.api_key),
                        ("--admin-api-key", d.admin_api_key)):
        if value is not None:
            words += [flag, str(value)]
    for flag, value in (("--tp", d.tp), ("--dp", d.dp)):
        if value > 1:
            words += [flag, str(value)]
    return shlex.join(hidden(words) if hide_keys else words)


def capture_instructions(d: Deployment, name: str, tiers=()) -> str:
    """The commands --profile-capture prints: phase 1 writes the diagonal (1-D table) and says how
    to start phase 2; phase 2 writes the profile to serve with."""
    static_out, out = f"sla_profiles/{name}-sglang-static.yaml", f"sla_profiles/{name}-sglang.yaml"
    if capture_phase(d) == "static":
        return (f"# phase 1 of 2 (static verify: every draft verified). Once the server is up, measure it (the admin "
                f"key where *** stands):\n{capture_command(d, static_out, hide_keys=True, tiers=tiers)}\n"
                "# phase 2: stop this server, restart it in compact mode with that table, and run the command it "
                f"prints:\n{relaunch_command(d, static_out, hide_keys=True)}")
    return (f"# phase 2 of 2 (compact verify, forced budget fractions). Once the server is up, measure it (the admin "
            f"key where *** stands):\n{capture_command(d, out, hide_keys=True, tiers=tiers)}")


PREFLIGHT_TIMEOUT_S = 300  # importing SGLang's DSpark stack takes seconds, more on a cold disk


def preflight(cmd: NodeCommand) -> str | None:
    """None when SGLang, started as `cmd`, will load the plugin; else why not (one line). Run in
    the interpreter and environment `cmd` execs (a venv without the bundle, another SGLang version
    or an allow-list without it would otherwise serve plain SGLang, the tier and profile unused)."""
    import subprocess

    try:
        done = subprocess.run([cmd.argv[0], "-m", "sglang_dspark.sglang_plugin"], capture_output=True, text=True,
                              env={**os.environ, **cmd.env}, timeout=PREFLIGHT_TIMEOUT_S)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"cannot check the plugin with {cmd.argv[0]} ({type(exc).__name__}: {exc})"
    if done.returncode == 0:
        return None
    errors = [line.removeprefix("error: ") for line in done.stderr.splitlines() if line.startswith("error: ")]
    reason = "; ".join(errors) or (done.stderr.strip().splitlines() or [f"exit status {done.returncode}"])[-1]
    return f"the sglang_dspark plugin would not load in {cmd.argv[0]}: {reason}"


def exec_command(cmd: NodeCommand) -> None:
    """Replace this process with SGLang's server, so signals and exit codes are SGLang's own; first
    check that the plugin will load there (SglangLaunchError otherwise)."""
    reason = preflight(cmd)
    if reason is not None:
        raise SglangLaunchError(reason)
    os.execvpe(cmd.argv[0], cmd.argv, {**os.environ, **cmd.env})
