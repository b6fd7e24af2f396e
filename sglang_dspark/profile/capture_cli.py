"""`python -m sglang_dspark.profile capture`: profile the reference engine into an SLA profile."""

from __future__ import annotations

import argparse
import shlex
import socket
import sys
from pathlib import Path


def add_parser(subparsers) -> None:
    p = subparsers.add_parser(
        "capture",
        help="capture SPS(B) of the reference engine in process and write an SLA profile (YAML + PNG plot)",
        description="Runs decode steps at forced verify budgets for several batch sizes, fits SGLang's "
        "1-D and additive SPS tables, and writes an SLA profile with its plot.",
    )
    p.add_argument("--model", required=True, help="target model directory or zoo name (e.g. smollm2-135m-instruct)")
    p.add_argument("--draft", help="drafter directory (default for a zoo model: the shipped drafter)")
    p.add_argument("--out", required=True, type=Path, help="profile YAML to write; the plot goes next to it as .png")
    p.add_argument("--name", help="profile name (default: the file stem of --out)")
    p.add_argument("--requests", default="1,2,4,8,16", help="comma-separated batch sizes R to probe")
    p.add_argument("--points", type=int, default=9, help="budgets probed per batch size (all of 0..R*G when fewer)")
    p.add_argument("--warmup", type=int, default=2, help="unmeasured steps before each probe")
    p.add_argument("--repeats", type=int, default=3, help="measured steps per probe in each round")
    p.add_argument("--rounds", type=int, default=3,
                   help="passes over all probes, each in a new random order; a probe's median pools its "
                   "rounds x repeats samples, so slow drift of a shared host averages out")
    p.add_argument("--prompt-tokens", type=int, default=128, help="context length of the probe requests")
    p.add_argument("--max-len", type=int, default=1024, help="engine context length per request")
    p.add_argument("--sts", type=Path, help="STS calibration JSON (SGLang format) to embed in the profile")
    p.add_argument("--tier", action="append", default=[], metavar="NAME:TOK_S:TTFT_S:CONCURRENCY",
                   help="SLA tier to record, e.g. interactive:20:2:4 (repeatable)")
    p.add_argument("--seed", type=int, default=0, help="seed of the probe order and the engine")
    p.add_argument("--cache-dir", type=Path, default=Path("~/.cache/sglang_dspark/models"), help="where zoo models live")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from tqdm import tqdm

    from sglang_dspark.core.calibration import StsCalibration
    from sglang_dspark.launch import SHIPPED_DRAFTS, resolve_model
    from sglang_dspark.profile.http_capture import parse_tier
    from sglang_dspark.core.sps import SpsTable
    from sglang_dspark.profile.capture import budget_grid, capture, fit_tables, plot
    from sglang_dspark.profiles import Measurement, Provenance, SlaProfile, SpsSection, fingerprint_for, utc_now
    from sglang_dspark.server.bootstrap import build_reference_engine
    from sglang_dspark.train.data import chat_prompt_ids

    requests = sorted({int(r) for r in args.requests.split(",")})
    model_dir, zoo_name = resolve_model(args.model, "reference", args.cache_dir, fetch=True)
    draft_dir = args.draft or (str(SHIPPED_DRAFTS / f"{zoo_name}-dspark") if zoo_name else None)
    if draft_dir is None or not Path(draft_dir).is_dir():
        print(f"error: drafter directory not found: {draft_dir}", file=sys.stderr)
        return 2
    tiers = [parse_tier(spec) for spec in args.tier]
    engine = build_reference_engine(model_dir, draft_dir, None, "scheduled", max(requests), args.max_len, seed=args.seed)
    chat = chat_prompt_ids(engine.tokenizer, "Explain, step by step, how a hash map handles collisions, with a Python example.")
    prompt = (chat * (args.prompt_tokens // len(chat) + 1))[-args.prompt_tokens :]
    total = args.rounds * sum(len(budget_grid(r, engine.gamma, args.points)) for r in requests)
    with tqdm(total=total, desc="SPS probes", unit="probe") as bar:
        probes = capture(engine, prompt, requests=requests, points=args.points, warmup=args.warmup,
                         repeats=args.repeats, rounds=args.rounds, seed=args.seed, progress=bar)
    cost, additive, draft_skip = fit_tables(probes, max(requests) * (engine.gamma + 1))
    profile = SlaProfile(
        version=1,
        name=args.name or args.out.stem,
        fingerprint=fingerprint_for(engine="reference", target_dir=model_dir, draft_dir=draft_dir, gamma=engine.gamma),
        sps=SpsSection(
            cost=cost,
            additive=additive,
            draft_skip_seconds=draft_skip,
            measurements=[
                Measurement(num_requests=p.num_requests, batch_tokens=p.batch_tokens, median_ms=round(p.median_ms, 3),
                            p10_ms=round(p.quantile_ms(0.1), 3), p90_ms=round(p.quantile_ms(0.9), 3), repeats=len(p.samples_ms))
                for p in probes
            ],
        ),
        sts=StsCalibration.load(args.sts) if args.sts else None,
        sla_tiers=tiers,
        provenance=Provenance(command=shlex.join(["python", "-m", "sglang_dspark.profile", *sys.argv[1:]]), date=utc_now(),
                              repeats=args.repeats, warmup=args.warmup, host=socket.gethostname(),
                              rounds=args.rounds),
    )
    profile.save(args.out)
    plot(probes, SpsTable(additive, draft_skip), args.out.with_suffix(".png"))
    print(f"wrote {args.out} and {args.out.with_suffix('.png')}: {len(probes)} probes")
    return 0
