"""Start a DSpark server: the CPU reference engine, or SGLang with DSpark on a GPU.

    python -m sglang_dspark.launch --model smollm2-135m-instruct
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import re
import sys
from pathlib import Path

from sglang_dspark import zoo
from sglang_dspark.engine.cpu.names import FORMAT_CHOICES
from sglang_dspark.help_format import DefaultsHelpFormatter, OneLineErrorParser

logger = logging.getLogger("sglang_dspark.launch")

MODES = ("target", "full", "scheduled")  # the engine's own list; not imported, to keep --help free of torch
DTYPES = FORMAT_CHOICES  # torch-free, as MODES
HF_REPO_ID = re.compile(r"^[\w.-]+/[\w.-]+$")  # SGLang downloads these itself
DEFAULT_MAX_RUNNING = 16


class LaunchError(Exception):
    """Bad command-line input; its message is the one line the user sees."""


def build_parser() -> argparse.ArgumentParser:
    p = OneLineErrorParser(prog="python -m sglang_dspark.launch", description=__doc__.splitlines()[0],
                           formatter_class=DefaultsHelpFormatter)
    p.add_argument("--model", required=True, metavar="DIR_OR_NAME",
                   help="target model: a local HF model directory, or a zoo name (e.g. smollm2-135m-instruct), "
                        "converted into --cache-dir on first use; with --engine sglang also a hub id ORG/NAME")
    p.add_argument("--draft", metavar="DIR",
                   help="DSpark drafter checkpoint directory (default: the shipped drafter in launch/models/ "
                        "trained for this target, found by the target's content hash)")
    p.add_argument("--profile", metavar="FILE",
                   help="SLA profile YAML (python -m sglang_dspark.profile): SPS table, STS calibration and SLA "
                        "tiers; refused unless its fingerprint (engine, hardware, versions, model/drafter content "
                        "hashes, gamma) matches this launch (default for a zoo model: its shipped profile, "
                        "when it matches)")
    p.add_argument("--force-profile", action="store_true",
                   help="use --profile even when its fingerprint does not match (the differences are logged); "
                        "without it, on the reference engine in scheduled mode with --sps-learning on, a profile "
                        "that differs only in hardware or library versions seeds the online SPS table (scaled to "
                        "this host's measured steps) instead; elsewhere it is refused")
    p.add_argument("--sps-learning", choices=("on", "off"), default="on",
                   help="scheduled mode: learn the SPS table online from the engine's own steps, seeded by the "
                        "profile when there is one (on), or use the profile's table as it is, and verify every "
                        "draft without one (off, SGLang's behaviour)")
    p.add_argument("--sla-tier", metavar="NAME",
                   help="SLA tier of the profile (--profile, or the one shipped for a zoo model) to serve: its "
                        "per-user tok/s target drives the SLA mode (step budgets and admission) and its "
                        "concurrency limit caps --max-running")
    p.add_argument("--engine", choices=("auto", "reference", "sglang"), default="auto",
                   help="auto: SGLang when a CUDA device and sglang are available, else the CPU reference engine")
    p.add_argument("--mode", choices=MODES, default="scheduled",
                   help="target: no speculation; full: DSpark verifying every draft; "
                        "scheduled: DSpark with the SPS-table verify scheduler")
    p.add_argument("--dtype", choices=DTYPES, default="auto",
                   help="reference engine's weight format: auto, on a CPU with native bfloat16 (avx512_bf16, "
                        "amx_bf16), takes int4 where the checkpoint's decoder weights already are Q4_1 values (a "
                        "de-quantized 4-bit GGUF, as the zoo's SmolLM2) and bfloat16 otherwise; elsewhere it times "
                        "bfloat16 against float32 at start and takes it where clearly faster; int8: weight-only int8 with bfloat16 "
                        "activations; int4: 4-bit groups of 32 (GGUF's Q4_1 block; a Q4_1-converted checkpoint's own "
                        "integers) with the lm_head in int8 (quantized models, verified losslessly against "
                        "themselves). SGLang has its own "
                        "--dtype / --quantization")
    p.add_argument("--host", default="127.0.0.1", help="address to listen on")
    p.add_argument("--port", type=int, default=30000, help="port to listen on")
    p.add_argument("--max-running", type=int, metavar="N",
                   help=f"concurrent requests (KV slots); more wait in a queue (default: {DEFAULT_MAX_RUNNING} on the "
                        "reference engine; SGLang's own choice on SGLang, or an SLA tier's max_concurrency)")
    p.add_argument("--max-len", type=int, metavar="N",
                   help="context per request, prompt + output tokens (default: the model's max_position_embeddings, "
                        "8192 for SmolLM2). The reference engine's KV cache holds max-running x max-len positions "
                        "(SmolLM2 in float32: 45 KiB per position plus 1.5 KiB of drafter context, 5.8 GiB at 16 x 8192); "
                        "memory is committed only as requests reach those positions")
    p.add_argument("--max-queued-requests", type=int, metavar="N",
                   help="requests that may wait for a slot (SGLang's flag); beyond it a request gets HTTP 429, and a "
                        "request whose n choices could never all be held gets a 400 (default: 8 per slot on the "
                        "reference engine; unbounded on SGLang)")
    p.add_argument("--threads", type=int, metavar="N",
                   help="reference engine: torch threads its steps run on (default: torch's own, one per CPU this "
                        "process may use, or OMP_NUM_THREADS); /server_info `threads` and the launch log say which "
                        "and what set it")
    p.add_argument("--seed", type=int, default=0, help="random seed of the engine")
    p.add_argument("--served-model-name", metavar="NAME",
                   help="name clients pass as `model` (default: the zoo name, or the model directory's base name)")
    p.add_argument("--api-key", metavar="KEY",
                   help="require `Authorization: Bearer KEY` on every endpoint but /health* and /metrics "
                        "(SGLang's --api-key)")
    p.add_argument("--admin-api-key", metavar="KEY",
                   help="require this key on admin endpoints (/set_internal_state, /flush_cache); with it set, "
                        "--api-key no longer opens them (SGLang's --admin-api-key)")
    p.add_argument("--tool-call-parser", metavar="NAME",
                   help="the model's tool-call format, one of SGLang's parser names (e.g. hermes, llama3, qwen25, "
                        "mistral, pythonic): with it, tool_choice auto is answered with the calls SGLang's parser "
                        "finds in the model's text; without it, auto is refused (SGLang's --tool-call-parser)")
    p.add_argument("--drain-timeout", type=float, default=30.0, metavar="S",
                   help="on SIGTERM / SIGINT: stop accepting, give running requests this many seconds, then end "
                        "the rest with finish_reason \"abort\" (every client gets a complete response)")
    p.add_argument("--canary-share", type=float, default=0.01, metavar="F",
                   help="share of greedy requests the reference engine decodes again without speculation, at "
                        "spare capacity, and compares token for token (sglang_dspark_canary_mismatches_total)")
    p.add_argument("--canary-dir", type=Path, metavar="DIR",
                   help="where mismatching canary replays are kept as evidence (JSON lines); default: not kept")
    p.add_argument("--cache-dir", type=Path, default=zoo.DEFAULT_CACHE, help="where zoo models are converted to")
    gpu = p.add_argument_group("SGLang (GPU) deployments", "passed to SGLang's own flags; see launch/router/README.md "
                               "for replicas behind sglang-router")
    gpu.add_argument("--tp", type=int, default=1, metavar="N", help="tensor parallel size (SGLang's --tp-size)")
    gpu.add_argument("--dp", type=int, default=1, metavar="N", help="data parallel size (SGLang's --dp-size)")
    gpu.add_argument("--nnodes", type=int, default=1, metavar="N", help="nodes of one tensor-parallel deployment; "
                     "the dry run prints every node's command")
    gpu.add_argument("--node-rank", type=int, default=0, metavar="I", help="this node's rank (0 .. nnodes-1)")
    gpu.add_argument("--dist-init-addr", metavar="HOST:PORT", help="node 0's rendezvous address (needed with --nnodes)")
    gpu.add_argument("--profile-capture", action="store_true",
                     help="start SGLang the way `profile capture-http` measures it (step records on) and print the "
                          "capture command. Phase 1, without --profile: static verify (the diagonal, a 1-D table); "
                          "phase 2, with --profile PHASE1.yaml: compact verify on that table, fractions swept")
    gpu.add_argument("--export-dir", type=Path, metavar="DIR",
                     help="where the profile's SPS / STS JSON for SGLang are written (default: "
                          "~/.cache/sglang_dspark/sglang/<profile hash>/)")
    p.add_argument("--dry-run", action="store_true",
                   help="print what would be launched (the SGLang command, or the reference engine's plan) and exit; "
                        "keys are shown as '***'. For SGLang the profile's tables are still exported, since the "
                        "printed command reads them")
    return p


def pick_engine(requested: str) -> tuple[str, str]:
    """(engine, why)."""
    if requested != "auto":
        return requested, "requested with --engine"
    import torch

    if not torch.cuda.is_available():
        return "reference", "no CUDA device"
    try:
        import sglang  # noqa: F401
    except Exception as exc:  # a broken install must not stop the CPU path
        return "reference", f"sglang is not importable ({type(exc).__name__}: {exc})"
    return "sglang", "CUDA device present and sglang importable"


def resolve_model(model: str, engine: str, cache_dir: Path, materialise: bool) -> tuple[str, str | None]:
    """(model directory or hub id, zoo name when it is one)."""
    if engine == "sglang" and not Path(model).is_dir() and model not in zoo.ZOO and HF_REPO_ID.match(model) \
            and not model.startswith("."):
        return model, None
    try:
        return zoo.resolve_model(model, cache_dir, materialise=materialise), (model if model in zoo.ZOO else None)
    except zoo.ZooError as exc:
        raise LaunchError(f"--model {exc}") from None


def resolve_draft(draft: str | None, model: str, mode: str, engine: str, zoo_name: str | None = None) -> str | None:
    """The drafter directory: --draft (checked to be one), else the shipped drafter whose target
    content hash matches `model` (by zoo name while a zoo model is not converted yet)."""
    if mode == "target":
        return None
    if draft is not None:
        if engine == "sglang" and not Path(draft).exists() and HF_REPO_ID.match(draft) and not draft.startswith("."):
            return draft
        from sglang_dspark.drafter.checkpoint import read_drafter_config

        try:
            read_drafter_config(draft)
        except ValueError as exc:
            raise LaunchError(f"--draft {exc}") from None
        return draft
    shipped = zoo.shipped_drafter_for(model, zoo_name)
    if shipped is None:
        raise LaunchError(f"mode {mode!r} needs a drafter and no shipped drafter was trained for {model} (shipped: "
                          f"{zoo.describe_shipped_drafters()}); pass --draft DIR, or --mode target")
    logger.info("drafter: %s (shipped; trained for this target, content hash matches)", shipped)
    return shipped


def model_context_length(model: str) -> int | None:
    try:
        return int(json.loads((Path(model) / "config.json").read_text())["max_position_embeddings"])
    except (OSError, ValueError, KeyError, TypeError):
        return None


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        _check_ranges(args)
        engine, why = pick_engine(args.engine)
        logger.info("engine: %s (%s)", engine, why)
        _warn_unused_flags(args, engine)
        if args.tool_call_parser:  # before any model loads: a typo fails at once, on either engine
            _check_tool_call_parser(args.tool_call_parser)
        model, zoo_name = resolve_model(args.model, engine, args.cache_dir, materialise=not args.dry_run)
        draft = resolve_draft(args.draft, model, args.mode, engine, zoo_name)
        args.weight_format = _weight_format(args, engine, model)
        profile = _load_profile(args, engine, model, draft) or _shipped_profile(args, engine, model, draft, zoo_name)
        if args.sla_tier is not None and profile is None:
            if args.mode != "scheduled":
                raise LaunchError(f"--sla-tier needs --mode scheduled (the tier drives the scheduler), not {args.mode}")
            raise LaunchError("--sla-tier needs --profile (the tiers live in the profile, and no shipped profile "
                              "fits this model and host: see the warnings above)")
        name = args.served_model_name or zoo_name or os.path.basename(os.path.normpath(model))
        if engine == "reference" and args.mode == "scheduled":
            logger.info("SPS table: %s", _table_plan(args, profile, model, zoo_name))
        if engine == "sglang":
            return _launch_sglang(args, model, draft, profile, name)
        return _launch_reference(args, model, draft, profile, name)
    except LaunchError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2


def _check_tool_call_parser(name: str) -> None:
    from sglang_dspark.server.tools import check_parser

    try:
        check_parser(name)
    except ImportError:
        raise LaunchError("--tool-call-parser: needs sglang installed (its parsers read the calls)") from None
    except ValueError as exc:
        raise LaunchError(str(exc)) from None


def _check_ranges(args) -> None:
    checks = (("--port", args.port, 0 < args.port < 65536), ("--tp", args.tp, args.tp >= 1),
              ("--dp", args.dp, args.dp >= 1), ("--nnodes", args.nnodes, args.nnodes >= 1),
              ("--drain-timeout", args.drain_timeout, args.drain_timeout >= 0),
              ("--canary-share", args.canary_share, 0.0 <= args.canary_share <= 1.0))
    for flag, value, ok in checks:
        if not ok:
            raise LaunchError(f"{flag} {value}: out of range")
    for flag, value in (("--max-running", args.max_running), ("--max-len", args.max_len), ("--threads", args.threads)):
        if value is not None and value < 1:
            raise LaunchError(f"{flag} {value}: must be >= 1")
    if args.max_queued_requests is not None and args.max_queued_requests < 0:
        raise LaunchError(f"--max-queued-requests {args.max_queued_requests}: must be >= 0")


REFERENCE_ONLY = ("drain_timeout", "canary_share", "canary_dir", "dtype", "threads")
SGLANG_ONLY = ("tp", "dp", "nnodes", "node_rank", "dist_init_addr", "profile_capture", "export_dir")


def _warn_unused_flags(args, engine: str) -> None:
    """Flags of the other engine do nothing here: say so rather than ignore them silently."""
    defaults = build_parser().parse_args(["--model", "x"])
    unused = SGLANG_ONLY if engine == "reference" else REFERENCE_ONLY
    for dest in unused:
        if getattr(args, dest) != getattr(defaults, dest):
            logger.warning("--%s has no effect with --engine %s", dest.replace("_", "-"), engine)


def _weight_format(args, engine: str, model: str) -> str | None:
    """The reference engine's weight format, decided before the profile is checked against it
    (`auto` is resolved here, once); None for SGLang, and for `auto` in a dry run (nothing is read or timed)."""
    if engine != "reference" or (args.dry_run and args.dtype == "auto"):
        return None
    import torch

    from sglang_dspark.engine.async_engine import off_the_main_thread
    from sglang_dspark.engine.factory import resolve_weight_format

    # timed off the main thread, so that only the engine thread's OpenMP pool stays (async_engine.py)
    def resolve():
        if args.threads is not None:  # timed on the thread count the engine will run on
            torch.set_num_threads(args.threads)
        return resolve_weight_format(args.dtype, model)

    weight_format, why = off_the_main_thread(resolve)
    logger.info("weight format: %s (%s)", weight_format, why)
    return weight_format


def _load_profile(args, engine: str, model: str, draft: str | None):
    """The checked SLA profile (profile/resolve.py LaunchProfile), or None without --profile."""
    if args.profile is None:
        if args.force_profile:
            raise LaunchError("--force-profile needs --profile FILE")
        return None
    from sglang_dspark.profile.resolve import resolve_profile
    from sglang_dspark.profile.schema import ProfileError

    try:
        resolved = resolve_profile(args.profile, engine=engine, model=model, draft=draft, force=args.force_profile,
                                   tier=args.sla_tier, seed_ok=_learning(args, engine), tp=args.tp, dp=args.dp,
                                   weight_format=args.weight_format)
    except ProfileError as exc:
        raise LaunchError(" ".join(str(exc).split())) from None
    logger.info("profile: %s", resolved.describe())
    return resolved


def _learning(args, engine: str) -> bool:
    """The reference engine learns from any seed; in SGLang the table picks CUDA-graph sizes, so a
    profile must match there."""
    return engine == "reference" and args.mode == "scheduled" and args.sps_learning == "on"


def _table_plan(args, profile, model: str, zoo_name: str | None) -> str:
    """What the scheduler's SPS table will be, and the command that improves on it."""
    url = f"http://{args.host}:{args.port}"
    capture = (f"python -m sglang_dspark.profile capture --model {zoo_name or model} "
               f"--out sla_profiles/{zoo_name or 'MODEL'}-cpu-this-host.yaml")
    snapshot = f"python -m sglang_dspark.profile snapshot --base-url {url} --out sla_profiles/learned.yaml"
    if args.sps_learning == "off":
        if profile is None:
            return f"flat (verify every draft, --sps-learning off); to schedule, capture a profile: {capture}"
        return f"{profile.path} as measured (--sps-learning off)"
    if profile is None:
        from sglang_dspark.engine.engine import EngineConfig  # torch: only once an engine is being built

        return ("learned online from this engine's own steps (no profile for this deployment): it starts "
                f"target-only and drafts 1 step in {EngineConfig.probe_every} to {EngineConfig.probe_max} to measure, "
                "until drafting measurably pays. "
                f"After some load, keep what it learned: {snapshot}")
    if profile.seed_only:
        return (f"seeded from {profile.path} (measured elsewhere: {'; '.join(profile.mismatches)}), scaled to this "
                f"host's measured steps and learned online. To keep this host's table: {snapshot}, or capture "
                f"one: {capture}")
    return f"{profile.path}, corrected online from this engine's steps"


def _shipped_profile(args, engine: str, model: str, draft: str | None, zoo_name: str | None):
    """The profile shipped for a zoo model whose fingerprint matches this host; else (learning on)
    one measured on other hardware, as a seed; else None. Its tiers serve --sla-tier."""
    if zoo_name is None or args.mode != "scheduled" or args.profile is not None:
        return None
    from sglang_dspark.profile.resolve import resolve_profile
    from sglang_dspark.profile.schema import ProfileError

    candidates, refused = [], []
    for path in zoo.shipped_profiles(zoo_name, engine):
        try:
            candidates.append(resolve_profile(str(path), engine=engine, model=model, draft=draft,
                                              tier=args.sla_tier, seed_ok=_learning(args, engine),
                                              weight_format=args.weight_format))
        except ProfileError as exc:
            refused.append(" ".join(str(exc).split()))
    # a matching profile; else the seed closest to this launch: its weight format first (a format
    # changes the cost shape: int4's verify of 7 drafts costs far more plain steps than bfloat16's), then
    # the fewest differences, then file order
    seeds = sorted((c for c in candidates if c.seed_only),
                   key=lambda c: ((c.profile.fingerprint.weight_format or "float32") != (args.weight_format or "float32"),
                                  len(c.mismatches)))
    chosen = next((c for c in candidates if not c.seed_only), None) or next(iter(seeds), None)
    if chosen is None:
        for reason in refused:
            logger.warning("shipped profile not used: %s", reason)
        return None
    logger.info("profile (shipped): %s", chosen.describe())
    return chosen


def _launch_sglang(args, model, draft, profile, name) -> int:
    from sglang_dspark import launch_sglang
    from sglang_dspark.profile.fingerprint import draft_gamma

    if not 0 <= args.node_rank < args.nnodes:
        raise LaunchError(f"--node-rank {args.node_rank}: must be in [0, --nnodes {args.nnodes})")
    if args.nnodes > 1 and args.mode == "scheduled" and not args.profile_capture and args.export_dir is None:
        raise LaunchError(f"--nnodes {args.nnodes}: every node reads the profile and the tables exported from it; "
                          "give --export-dir DIR on a filesystem all nodes share, with the profile file there too")
    sps = sts = None
    if profile is not None:  # with --profile-capture: phase 2, compact mode on the phase-1 table
        sps, sts = launch_sglang.export_profile(profile.profile, profile.path, args.export_dir)
    deployment = launch_sglang.Deployment(
        model=model, draft=draft, mode=args.mode, host=args.host, port=args.port, max_running=args.max_running,
        max_queued=args.max_queued_requests, max_len=args.max_len, seed=args.seed, served_model_name=name, api_key=args.api_key,
        admin_api_key=args.admin_api_key, tool_call_parser=args.tool_call_parser, tp=args.tp, dp=args.dp,
        nnodes=args.nnodes,
        dist_init_addr=args.dist_init_addr, gamma=draft_gamma(draft) if draft and Path(draft).is_dir() else None,
        profile_path=str(Path(profile.path).resolve()) if profile is not None else None, sps_path=sps, sts_path=sts,
        tier=profile.tier if profile is not None else None, sps_learning=args.sps_learning == "on",
        profile_capture=args.profile_capture, user_plugins=os.environ.get("SGLANG_PLUGINS"),
        measured_requests=launch_sglang.measured_requests(profile.profile) if profile is not None else None,
        force_profile=args.force_profile)
    try:
        nodes = launch_sglang.commands(deployment)
    except launch_sglang.SglangLaunchError as exc:
        raise LaunchError(str(exc)) from None
    for note in launch_sglang.guard_notes(deployment):
        print(f"note: {note}", file=sys.stderr, flush=True)
    if args.dry_run:
        for node in nodes:
            if len(nodes) > 1:
                print(f"# node {node.node_rank} of {len(nodes)}")
            print(node.render(hide_keys=True), flush=True)
    if args.profile_capture:
        tiers = profile.profile.sla_tiers if profile is not None else ()
        print(launch_sglang.capture_instructions(deployment, name, tiers), flush=True)
    if not args.dry_run:
        try:
            launch_sglang.exec_command(nodes[args.node_rank])
        except launch_sglang.SglangLaunchError as exc:  # the plugin would not load there
            raise LaunchError(str(exc)) from None
    return 0


def _identity(model: str, draft: str | None, weight_format: str | None = None) -> dict:
    """This deployment's fingerprint (content hashes, hardware, versions), which /server_info reports
    so that `profile snapshot` can write a profile launch accepts here."""
    if draft is None:
        return {}
    from sglang_dspark.profile.fingerprint import draft_gamma, fingerprint_for

    return fingerprint_for(engine="reference", target_dir=model, draft_dir=draft, gamma=draft_gamma(draft),
                           weight_format=weight_format).model_dump()


def _launch_reference(args, model, draft, profile, name) -> int:
    url = f"http://{args.host}:{args.port}"
    tier = profile.tier if profile is not None else None
    max_running = args.max_running or DEFAULT_MAX_RUNNING
    if tier is not None:  # the tier's concurrency limit caps the running batch
        max_running = min(max_running, tier.max_concurrency)
    model_len = model_context_length(model)
    if args.max_len is not None and model_len is not None and args.max_len > model_len:
        logger.warning("--max-len %d: the model's context is %d tokens; requests get %d", args.max_len, model_len,
                       model_len)
    context = min(args.max_len or 1 << 30, model_len or 1 << 30)
    if args.dry_run:
        print(f"reference engine: model={model} draft={draft} mode={args.mode} sps_learning={args.sps_learning} "
              f"dtype={args.weight_format or args.dtype} "
              f"profile={profile.describe() if profile is not None else None} max_running={max_running} "
              f"context={context if context < 1 << 30 else 'model default'} seed={args.seed} served as {name!r} "
              f"on {url} auth={'api-key' if args.api_key else 'none'}"
              f"{' +admin-api-key' if args.admin_api_key else ''}")
        return 0
    from sglang_dspark.engine.async_engine import AsyncEngine
    from sglang_dspark.engine.engine import EngineConfig
    from sglang_dspark.engine.factory import build_engine
    from sglang_dspark.engine.threads import set_engine_threads
    from sglang_dspark.server import create_app, serve
    from sglang_dspark.server.runner import READY_PREFIX

    config = EngineConfig(mode=args.mode, max_running=max_running, max_len=args.max_len, seed=args.seed,
                          max_queued_requests=args.max_queued_requests,
                          sla_tok_s_per_user=tier.tok_s_per_user if tier is not None else None,
                          learn_sps=args.sps_learning == "on", canary_share=args.canary_share,
                          canary_dir=str(args.canary_dir) if args.canary_dir else None)
    identity = _identity(model, draft, args.weight_format)

    def build():  # on the engine thread, which then runs it (AsyncEngine.built_on_its_thread)
        threads = set_engine_threads(args.threads)  # before its first torch op: its OpenMP team is named
        return build_engine(model, draft, config=config, model_name=name,
                            sps=profile.profile.sps_table() if profile is not None else None,
                            sts=profile.profile.sts_temperatures() if profile is not None else None,
                            sps_seeded=profile is not None and profile.seed_only,
                            identity=identity, weight_format=args.weight_format, threads=threads)

    try:
        client = AsyncEngine.built_on_its_thread(build)
    except ValueError as exc:
        raise LaunchError(str(exc)) from None
    app = create_app(client, served_model_name=name, api_key=args.api_key, admin_api_key=args.admin_api_key,
                     tool_call_parser=args.tool_call_parser)
    serve(client, app, args.host, args.port, drain_s=args.drain_timeout,
          ready_line=f"{READY_PREFIX} {url} (engine=reference, mode={args.mode}, model={name!r})")
    return 0


if __name__ == "__main__":
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    sys.exit(main())
