"""Start a DSpark server: the CPU reference engine, or SGLang with DSpark on a GPU.

    python -m sglang_dspark.launch --model smollm2-135m-instruct --mode scheduled
"""

from __future__ import annotations

import argparse
import logging
import os
import re
import sys
from pathlib import Path

logger = logging.getLogger("sglang_dspark.launch")

MODES = ("target", "full", "scheduled")  # the engine's own list; not imported, to keep --help free of torch
DEFAULT_CACHE = Path("~/.cache/sglang_dspark/models")
SHIPPED_DRAFTS = Path(__file__).resolve().parent.parent / "launch" / "models"  # <zoo name>-dspark/
SHIPPED_PROFILES = Path(__file__).resolve().parent.parent / "sla_profiles"  # <zoo name>-<engine>.yaml
HF_REPO_ID = re.compile(r"^[\w.-]+/[\w.-]+$")  # SGLang downloads these itself


class LaunchError(Exception):
    """Bad command-line input; its message is the one line the user sees."""


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m sglang_dspark.launch", description=__doc__.splitlines()[0])
    p.add_argument("--model", required=True, metavar="DIR_OR_NAME",
                   help="target model: a local HF model directory, or a zoo name (e.g. smollm2-135m-instruct), "
                        "fetched into --cache-dir on first use; with --engine sglang also a hub id ORG/NAME")
    p.add_argument("--draft", metavar="DIR",
                   help="DSpark drafter checkpoint directory (default for a zoo model: the shipped "
                        "launch/models/<name>-dspark/)")
    p.add_argument("--profile", metavar="FILE",
                   help="SLA profile YAML (python -m sglang_dspark.profile): SPS table, STS calibration and SLA "
                        "tiers; refused unless its fingerprint (engine, hardware, versions, model/drafter content "
                        "hashes, gamma) matches this launch")
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
    p.add_argument("--max-running", type=int, metavar="N", help="concurrent requests (KV slots); engine default if unset")
    p.add_argument("--max-len", type=int, metavar="N", help="context length per request; engine default if unset")
    p.add_argument("--seed", type=int, default=0, help="random seed of the engine")
    p.add_argument("--served-model-name", metavar="NAME",
                   help="name clients pass as `model` (default: the --model value)")
    p.add_argument("--cache-dir", type=Path, default=DEFAULT_CACHE, help="where zoo models are fetched to")
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


def resolve_model(model: str, engine: str, cache_dir: Path, fetch: bool) -> tuple[str, str | None]:
    """(model path or hub id, zoo name when it is one)."""
    if Path(model).is_dir():
        return model, None
    from sglang_dspark import zoo

    if model in zoo.ZOO:
        out = cache_dir.expanduser() / model
        if fetch:
            try:
                if zoo.fetch(model, out):
                    logger.info("fetched zoo model %s into %s", model, out)
            except zoo.ZooError as exc:
                raise LaunchError(f"--model {model}: {exc}") from None
        return str(out), model
    if engine == "sglang" and HF_REPO_ID.match(model) and not model.startswith("."):
        return model, None
    raise LaunchError(f"--model {model}: no such directory, and not a zoo model (known: {', '.join(sorted(zoo.ZOO))})")


def resolve_draft(draft: str | None, zoo_name: str | None, mode: str, engine: str) -> str | None:
    if mode == "target":
        return None
    if draft is not None:
        if Path(draft).is_dir() or (engine == "sglang" and HF_REPO_ID.match(draft) and not draft.startswith(".")):
            return draft
        raise LaunchError(f"--draft {draft}: no such directory")
    shipped = SHIPPED_DRAFTS / f"{zoo_name}-dspark" if zoo_name else None
    if shipped is not None and shipped.is_dir():
        return str(shipped)
    raise LaunchError(f"mode {mode!r} needs a drafter: pass --draft DIR, or --mode target")


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        for flag, value in (("--port", args.port), ("--max-running", args.max_running), ("--max-len", args.max_len)):
            if value is not None and not (0 < value < 65536 if flag == "--port" else value > 0):
                raise LaunchError(f"{flag} {value}: out of range")
        engine, why = pick_engine(args.engine)
        logger.info("engine: %s (%s)", engine, why)
        model, zoo_name = resolve_model(args.model, engine, args.cache_dir, fetch=not args.dry_run)
        draft = resolve_draft(args.draft, zoo_name, args.mode, engine)
        profile = _load_profile(args, engine, model, draft) or _shipped_profile(args, engine, model, draft, zoo_name)
        if engine == "sglang":  # SGLang names the model by its path unless told otherwise
            return _launch_sglang(args, model, draft, profile, args.served_model_name or zoo_name)
        return _launch_reference(args, model, draft, profile, args.served_model_name or args.model)
    except LaunchError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2


def _load_profile(args, engine: str, model: str, draft: str | None):
    """The checked SLA profile (server/profiles.py LaunchProfile), or None without --profile."""
    if args.profile is None:
        if args.sla_tier is not None:
            raise LaunchError("--sla-tier needs --profile (the tiers live in the profile)")
        if args.force_profile:
            raise LaunchError("--force-profile needs --profile")
        return None
    from sglang_dspark.profiles import ProfileError
    from sglang_dspark.server.profiles import resolve_profile

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
    if args.profile is not None or zoo_name is None or args.mode != "scheduled":
        return None
    path = SHIPPED_PROFILES / f"{zoo_name}-{'cpu' if engine == 'reference' else engine}.yaml"
    if not path.is_file():
        return None
    from sglang_dspark.profiles import ProfileError
    from sglang_dspark.server.profiles import resolve_profile

    try:
        resolved = resolve_profile(str(path), engine=engine, model=model, draft=draft, force=False, tier=None)
    except ProfileError as exc:
        logger.warning("shipped profile not used, the scheduler verifies every draft: %s", " ".join(str(exc).split()))
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
        seed=args.seed, sps_path=sps_path, sts_path=sts_path, served_model_name=name)
    print(launch_sglang.render(argv, env), flush=True)
    if not args.dry_run:
        launch_sglang.exec_command(argv, env)
    return 0


def _launch_reference(args, model, draft, profile, name) -> int:
    url = f"http://{args.host}:{args.port}"
    tier = profile.tier if profile is not None else None
    max_running = args.max_running
    if tier is not None:  # the tier's concurrency limit caps the running batch
        max_running = min(max_running or tier.max_concurrency, tier.max_concurrency)
    if args.dry_run:
        print(f"reference engine: model={model} draft={draft} mode={args.mode} "
              f"profile={profile.describe() if profile is not None else None} "
              f"max_running={max_running} max_len={args.max_len} seed={args.seed} served as {name!r} on {url}")
        return 0
    from sglang_dspark.server import create_app, serve
    from sglang_dspark.server.bootstrap import build_reference_engine

    engine = build_reference_engine(model, draft, profile.profile if profile is not None else None, args.mode,
                                    max_running, args.max_len, args.seed, model_name=name,
                                    sla_tok_s_per_user=tier.tok_s_per_user if tier is not None else None)
    serve(engine, create_app(engine, served_model_name=name), args.host, args.port,
          ready_line=f"DSpark server ready on {url} (engine=reference, mode={args.mode})")
    return 0


if __name__ == "__main__":
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    sys.exit(main())
