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

logger = logging.getLogger("sglang_dspark.launch")

MODES = ("target", "full", "scheduled")  # the engine's own list; not imported, to keep --help free of torch
HF_REPO_ID = re.compile(r"^[\w.-]+/[\w.-]+$")  # SGLang downloads these itself
DEFAULT_MAX_RUNNING = 16


class LaunchError(Exception):
    """Bad command-line input; its message is the one line the user sees."""


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m sglang_dspark.launch", description=__doc__.splitlines()[0],
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
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
                   help="use --profile even when its fingerprint does not match (the differences are logged)")
    p.add_argument("--sla-tier", metavar="NAME",
                   help="SLA tier of --profile to serve: its per-user tok/s target drives the engine's SLA mode "
                        "(step budgets and admission) and its concurrency limit caps --max-running")
    p.add_argument("--engine", choices=("auto", "reference", "sglang"), default="auto",
                   help="auto: SGLang when a CUDA device and sglang are available, else the CPU reference engine")
    p.add_argument("--mode", choices=MODES, default="scheduled",
                   help="target: no speculation; full: DSpark verifying every draft; "
                        "scheduled: DSpark with the SPS-table verify scheduler")
    p.add_argument("--host", default="127.0.0.1", help="address to listen on")
    p.add_argument("--port", type=int, default=30000, help="port to listen on")
    p.add_argument("--max-running", type=int, default=DEFAULT_MAX_RUNNING, metavar="N",
                   help="concurrent requests (KV slots); more wait in a queue")
    p.add_argument("--max-len", type=int, metavar="N",
                   help="context per request, prompt + output tokens (default: the model's max_position_embeddings, "
                        "8192 for SmolLM2). The reference engine's KV cache holds max-running x max-len positions "
                        "(SmolLM2 in float32: 45 KiB per position plus 1.5 KiB of drafter context, 5.8 GiB at 16 x 8192); "
                        "memory is committed only as requests reach those positions")
    p.add_argument("--seed", type=int, default=0, help="random seed of the engine")
    p.add_argument("--served-model-name", metavar="NAME",
                   help="name clients pass as `model` (default: the zoo name, or the model directory's base name)")
    p.add_argument("--api-key", metavar="KEY",
                   help="require `Authorization: Bearer KEY` on every endpoint but /health* and /metrics "
                        "(SGLang's --api-key)")
    p.add_argument("--admin-api-key", metavar="KEY",
                   help="require this key on admin endpoints (/set_internal_state, /flush_cache); with it set, "
                        "--api-key no longer opens them (SGLang's --admin-api-key)")
    p.add_argument("--cache-dir", type=Path, default=zoo.DEFAULT_CACHE, help="where zoo models are converted to")
    p.add_argument("--dry-run", action="store_true",
                   help="print what would be launched (the SGLang command, or the reference engine's plan) and exit")
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


def resolve_draft(draft: str | None, model: str, mode: str, engine: str) -> str | None:
    """The drafter directory: --draft (checked to be one), else the shipped drafter whose target
    content hash matches `model`."""
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
    shipped = zoo.shipped_drafter_for(model) if Path(model).is_dir() else None
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
        for flag, value in (("--port", args.port), ("--max-running", args.max_running), ("--max-len", args.max_len)):
            if value is not None and not (0 < value < 65536 if flag == "--port" else value > 0):
                raise LaunchError(f"{flag} {value}: out of range")
        engine, why = pick_engine(args.engine)
        logger.info("engine: %s (%s)", engine, why)
        model, zoo_name = resolve_model(args.model, engine, args.cache_dir, materialise=not args.dry_run)
        draft = resolve_draft(args.draft, model, args.mode, engine)
        profile = _load_profile(args, engine, model, draft) or _shipped_profile(args, engine, model, draft, zoo_name)
        name = args.served_model_name or zoo_name or os.path.basename(os.path.normpath(model))
        if engine == "sglang":
            return _launch_sglang(args, model, draft, profile, name)
        return _launch_reference(args, model, draft, profile, name)
    except LaunchError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2


def _load_profile(args, engine: str, model: str, draft: str | None):
    """The checked SLA profile (profile/resolve.py LaunchProfile), or None without --profile."""
    if args.profile is None:
        if args.sla_tier is not None:
            raise LaunchError("--sla-tier needs --profile (the tiers live in the profile)")
        if args.force_profile:
            raise LaunchError("--force-profile needs --profile FILE")
        return None
    from sglang_dspark.profile.resolve import resolve_profile
    from sglang_dspark.profile.schema import ProfileError

    try:
        resolved = resolve_profile(args.profile, engine=engine, model=model, draft=draft, force=args.force_profile,
                                   tier=args.sla_tier)
    except ProfileError as exc:
        raise LaunchError(" ".join(str(exc).split())) from None
    logger.info("profile: %s", resolved.describe())
    return resolved


def _shipped_profile(args, engine: str, model: str, draft: str | None, zoo_name: str | None):
    """The profile shipped for a zoo model when it was captured on hardware like this one;
    otherwise None, and the scheduler runs on a flat table (verify everything)."""
    if zoo_name is None or args.mode != "scheduled":
        return None
    path = zoo.shipped_profile(zoo_name, engine)
    if not path.is_file():
        return None
    from sglang_dspark.profile.resolve import resolve_profile
    from sglang_dspark.profile.schema import ProfileError

    try:
        resolved = resolve_profile(str(path), engine=engine, model=model, draft=draft)
    except ProfileError as exc:
        logger.warning("shipped profile not used, the scheduler verifies every draft: %s. To use it anyway: "
                       "--profile %s --force-profile", " ".join(str(exc).split()), path)
        return None
    logger.info("profile (shipped): %s", resolved.describe())
    return resolved


def _launch_sglang(args, model, draft, profile, name) -> int:
    import tempfile

    from sglang_dspark import launch_sglang

    sps_path = sts_path = None
    if profile is not None:  # SGLang reads its own JSON files: export them to a dir that outlives the exec
        out = tempfile.mkdtemp(prefix="dspark-profile-")
        sps, sts = profile.profile.export_sglang(out)
        sps_path, sts_path = str(sps), (str(sts) if sts is not None else None)
        if profile.tier is not None:
            logger.warning("--sla-tier %s: SGLang has no SLA mode; the tier is not enforced", profile.tier.name)

    argv, env = launch_sglang.build_command(
        model, draft, args.mode, args.host, args.port, max_running=args.max_running, max_len=args.max_len,
        seed=args.seed, sps_path=sps_path, sts_path=sts_path, served_model_name=name, api_key=args.api_key,
        admin_api_key=args.admin_api_key)
    print(launch_sglang.render(argv, env), flush=True)
    if not args.dry_run:
        launch_sglang.exec_command(argv, env)
    return 0


def _launch_reference(args, model, draft, profile, name) -> int:
    url = f"http://{args.host}:{args.port}"
    tier = profile.tier if profile is not None else None
    max_running = args.max_running
    if tier is not None:  # the tier's concurrency limit caps the running batch
        max_running = min(max_running, tier.max_concurrency)
    context = min(args.max_len or 1 << 30, model_context_length(model) or 1 << 30)
    if args.dry_run:
        print(f"reference engine: model={model} draft={draft} mode={args.mode} "
              f"profile={profile.describe() if profile is not None else None} max_running={max_running} "
              f"context={context if context < 1 << 30 else 'model default'} seed={args.seed} served as {name!r} "
              f"on {url} auth={'api-key' if args.api_key else 'none'}"
              f"{' +admin-api-key' if args.admin_api_key else ''}")
        return 0
    from sglang_dspark.engine.async_engine import AsyncEngine
    from sglang_dspark.engine.engine import EngineConfig
    from sglang_dspark.engine.factory import build_engine
    from sglang_dspark.server import create_app, serve

    config = EngineConfig(mode=args.mode, max_running=max_running, max_len=args.max_len, seed=args.seed,
                          sla_tok_s_per_user=tier.tok_s_per_user if tier is not None else None)
    try:
        engine = build_engine(model, draft, config=config, model_name=name,
                              sps=profile.profile.sps_table() if profile is not None else None,
                              sts=profile.profile.sts_temperatures() if profile is not None else None)
    except ValueError as exc:
        raise LaunchError(str(exc)) from None
    client = AsyncEngine(engine)
    app = create_app(client, served_model_name=name, api_key=args.api_key, admin_api_key=args.admin_api_key)
    serve(client, app, args.host, args.port,
          ready_line=f"DSpark server ready on {url} (engine=reference, mode={args.mode}, model={name!r})")
    return 0


if __name__ == "__main__":
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    sys.exit(main())
