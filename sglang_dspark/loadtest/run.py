"""`python -m sglang_dspark.loadtest run`: a headless concurrency sweep, its report.json, and the SLA gate.

One Locust run per concurrency step, not one run with the load shape: every request of a step then
ran under exactly that step's number of users (with a shape, requests in flight at a step change
finish under the next step's load), each step gets its own Locust stats file to cross-check the
record counts against, and a step that breaks does not take the others with it. The price is
Locust's start-up per step: about a second, two to three with workers.

Exit status: 0, or 1 with one line when the gated tier's attainment is below its share at some gated
step (or a step has no successful request, or Locust breaks), or 2 with one line for bad input.
"""

from __future__ import annotations

import importlib.util
import json
import subprocess
from pathlib import Path

import httpx

from sglang_dspark.help_format import DefaultsHelpFormatter
from sglang_dspark.loadtest.locust_process import run_locust
from sglang_dspark.loadtest.steps import parse_duration, parse_users
from sglang_dspark.loadtest.summary import DEFINITIONS, summarize_step
from sglang_dspark.loadtest.tiers import Tier, gate_failures, parse_tier, profile_tiers
from sglang_dspark.loadtest.workload import (
    DEFAULT_PROMPTS, ENDPOINT_CHOICES, LENGTH_SPEC_HELP, OutputLength, prompts_by_domain,
)

REPORT_NAME = "report.json"


class RunFailed(Exception):
    """The sweep ran but fails (exit 1); bad input is a ValueError (exit 2)."""


def add_run_parser(subparsers) -> None:
    p = subparsers.add_parser(
        "run", help="sweep concurrency steps against a server with Locust and write DIR/report.json",
        description=" ".join(__doc__.split("\n\n")[1:]), formatter_class=DefaultsHelpFormatter)
    p.add_argument("--host", required=True, metavar="URL",
                   help="base URL of an OpenAI-compatible server, e.g. http://127.0.0.1:30000")
    p.add_argument("--users", default="1,4,16", metavar="N,N,...",
                   help="concurrency steps (simulated users), comma-separated")
    p.add_argument("--duration", default="30s", metavar="TIME", help="how long each step runs (30s, 2m, 1h30m)")
    p.add_argument("--tier", action="append", default=[], metavar="NAME:TOK_S",
                   help="an SLA tier in tokens per second per user (repeatable); replaces the profile's tiers")
    p.add_argument("--profile", type=Path, metavar="FILE",
                   help="SLA profile YAML whose sla_tiers are the default tiers")
    p.add_argument("--gate", metavar="NAME", help="fail (exit 1) when this tier's attainment is below --gate-share at "
                                                  "any step within its max_concurrency (all steps if it has none)")
    p.add_argument("--gate-share", type=float, default=0.9, metavar="SHARE",
                   help="share of requests the gated tier must reach")
    p.add_argument("--out", required=True, type=Path, metavar="DIR",
                   help="run directory (report.json, one folder per step)")
    p.add_argument("--api-key", metavar="KEY",
                   help="sent as 'Authorization: Bearer KEY' (passed to Locust in its environment)")
    p.add_argument("--prompts", default=DEFAULT_PROMPTS, metavar="SPEC",
                   help="prompt set: any spec sglang_dspark.prompts.load_prompts takes (builtin:heldout has code, "
                        "chat and math; also builtin:eval, mt-bench, humaneval, sharegpt, a JSONL file)")
    p.add_argument("--domain", action="append", metavar="NAME",
                   help="a domain of the prompt set to draw from (repeatable); default: all of its domains, "
                        "each getting the same share of requests")
    p.add_argument("--max-tokens", default="128", metavar="SPEC",
                   help=f"output tokens per request: {LENGTH_SPEC_HELP}")
    p.add_argument("--endpoint", choices=ENDPOINT_CHOICES, default="chat",
                   help="chat: /v1/chat/completions, completions: /v1/completions, mixed: either per request")
    p.add_argument("--model", metavar="NAME", help="model name to request (default: the first one /v1/models lists)")
    p.add_argument("--temperature", type=float, default=0.0, metavar="T", help="sampling temperature")
    p.add_argument("--seed", type=int, default=0, metavar="N", help="seed of the prompt and output-length draws")
    p.add_argument("--workers", type=int, default=0, metavar="N",
                   help="0: one Locust process; N: a Locust master and N workers on loopback")
    p.add_argument("--timeout", type=float, default=600.0, metavar="SECONDS", help="seconds one request may take")
    p.set_defaults(func=run)


def _flag(flag: str, parse, text: str):
    """parse(text), its error prefixed with the flag it came from."""
    try:
        return parse(text)
    except ValueError as exc:
        raise ValueError(f"{flag}: {exc}") from None


def _profile_tiers(path: Path) -> list[Tier]:
    try:
        return profile_tiers(path)
    except ValueError as exc:  # "<file>: <reason>", named after the flag it came from
        raise ValueError(f"--profile {exc}") from None


def _tiers(args) -> list[Tier]:
    tiers = [parse_tier(t) for t in args.tier] if args.tier else _profile_tiers(args.profile) if args.profile else []
    if len({t.name for t in tiers}) != len(tiers):
        raise ValueError(f"tiers: a name appears twice ({', '.join(t.name for t in tiers)})")
    return tiers


def _gate_tier(args, tiers: list[Tier], users: list[int]) -> Tier | None:
    if args.gate is None:
        return None
    tier = next((t for t in tiers if t.name == args.gate), None)
    if tier is None:
        names = ", ".join(t.name for t in tiers) or "none: give --tier or --profile"
        raise ValueError(f"--gate {args.gate!r} names no tier (tiers: {names})")
    if tier.max_concurrency is not None and min(users) > tier.max_concurrency:
        raise ValueError(f"--gate {tier.name}: no step within its max_concurrency {tier.max_concurrency}")
    if not 0 < args.gate_share <= 1:
        raise ValueError(f"--gate-share {args.gate_share}: expected a share in (0, 1]")
    return tier


def _checked_inputs(args) -> tuple[list[int], int, list[Tier], Tier | None, str]:
    """Everything checkable before a request is sent: (users, seconds per step, tiers, gated tier,
    domains); ValueError with the flag at fault."""
    users = _flag("--users", parse_users, args.users)
    duration_s = _flag("--duration", parse_duration, args.duration)
    tiers = _tiers(args)
    gate = _gate_tier(args, tiers, users)
    _flag("--max-tokens", OutputLength.parse, args.max_tokens)
    domains = ",".join(prompts_by_domain(args.prompts, ",".join(args.domain or ())))
    if args.workers < 0:
        raise ValueError(f"--workers {args.workers}: expected 0 or more")
    if importlib.util.find_spec("locust") is None:
        raise ValueError("locust is not installed: pip install 'sglang-dspark[loadtest]'")
    return users, duration_s, tiers, gate, domains


def _served_model(host: str, api_key: str | None) -> str:
    """The first model /v1/models lists; also proves the server is reachable before Locust starts."""
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    try:
        r = httpx.get(f"{host}/v1/models", headers=headers, timeout=10)
    except httpx.HTTPError as exc:
        raise ValueError(f"cannot reach {host}: GET /v1/models: {type(exc).__name__}: {exc}") from None
    if r.status_code != 200:
        raise ValueError(f"{host}: GET /v1/models: HTTP {r.status_code} {' '.join(r.text[:160].split())}")
    try:
        return r.json()["data"][0]["id"]
    except (ValueError, KeyError, IndexError, TypeError):
        raise ValueError(f"{host}: GET /v1/models lists no model; give --model") from None


def _locust_counts(path: Path) -> dict:
    """Locust's own request and failure counts (its named request rows, not the METRIC rows)."""
    rows = [e for e in json.loads(path.read_text()) if e["method"] != "METRIC"] if path.exists() else []
    return {"requests": sum(e["num_requests"] for e in rows), "failures": sum(e["num_failures"] for e in rows)}


def _fmt(value: float | None, spec: str) -> str:
    return "n/a" if value is None else format(value, spec)


def _progress(i: int, n: int, step: dict) -> str:
    shares = ", ".join(f"{name} {_fmt(v, '.0%')}" for name, v in step["attainment"].items())
    return (f"step {i}/{n}: concurrency {step['users']}, {step['duration_s']} s: {step['requests']} requests "
            f"({step['failures']} failed), TTFT p50 {_fmt(step['ttft_ms']['p50'], '.0f')} ms, per-user p50 "
            f"{_fmt(step['user_tok_s']['p50'], '.1f')} tok/s, aggregate "
            f"{_fmt(step['aggregate_output_tok_s'], '.1f')} tok/s" + (f", attainment: {shares}" if shares else ""))


def _run_step(args, i: int, users: int, duration_s: int, llm_options: list[str], tier_speeds: dict) -> dict:
    try:
        rc, files = run_locust(host=args.host.rstrip("/"), users=users, duration_s=duration_s,
                               out_dir=args.out / f"step{i}_u{users}", llm_options=llm_options,
                               api_key=args.api_key, workers=args.workers)
    except subprocess.TimeoutExpired:
        raise RunFailed(f"step {i} (concurrency {users}): Locust did not finish in time (see "
                        f"{args.out}/step{i}_u{users}/locust.log)") from None
    if not files.records.exists():
        raise RunFailed(f"step {i} (concurrency {users}): Locust exited with {rc} and wrote no records "
                        f"(see {files.log})")
    records = json.loads(files.records.read_text())
    return {"step": i, "users": users, "duration_s": duration_s, **summarize_step(records, tier_speeds),
            "locust": {**_locust_counts(files.locust_json), "exit_code": rc}, "dir": files.log.parent.name}


def run(args) -> int:
    users, duration_s, tiers, gate, domains = _checked_inputs(args)
    host = args.host.rstrip("/")
    model = args.model or _served_model(host, args.api_key)
    llm_options = ["--llm-endpoint", args.endpoint, "--llm-model", model, "--llm-prompts", args.prompts,
                   "--llm-domains", domains, "--llm-max-tokens", args.max_tokens,
                   "--llm-temperature", str(args.temperature), "--llm-seed", str(args.seed),
                   "--llm-timeout", str(args.timeout)]
    tier_speeds = {t.name: t.tok_s_per_user for t in tiers}
    steps = []
    for i, n in enumerate(users):
        steps.append(_run_step(args, i, n, duration_s, llm_options, tier_speeds))
        print(_progress(i + 1, len(users), steps[-1]), flush=True)

    failures = gate_failures(steps, gate, args.gate_share) if gate else []
    report = {
        "host": host, "model": model, "endpoint": args.endpoint, "prompts": args.prompts,
        "domains": domains.split(","), "max_tokens": args.max_tokens, "temperature": args.temperature,
        "seed": args.seed, "workers": args.workers,
        "tiers": [t.as_dict() for t in tiers],
        "gate": gate and {"tier": gate.name, "share": args.gate_share, "passed": not failures},
        "definitions": DEFINITIONS, "steps": steps,
    }
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / REPORT_NAME).write_text(json.dumps(report, indent=2) + "\n")
    print(f"wrote {args.out / REPORT_NAME}")

    empty = [str(s["users"]) for s in steps if s["requests"] == s["failures"]]
    if empty:
        raise RunFailed(f"no successful request at concurrency {', '.join(empty)} (see the steps' locust.log)")
    if failures:
        more = f" (and {len(failures) - 1} more gated step{'s' * (len(failures) > 2)})" if len(failures) > 1 else ""
        raise RunFailed(f"gate failed: {failures[0]}{more}")
    return 0
