"""`python -m sglang_dspark.canary_probe`: the correctness canary for fleets the bundle does not run.

The reference engine replays its own greedy requests (engine/canary.py). An SGLang fleet behind
sglang-router cannot be asked to, so this prober does the same from outside: it sends greedy
requests (held-out prompts) to the DSpark deployment (the router) and to a target-only replica
(`launch --mode target`, kept out of the router), compares the token ids (`/generate`'s
`output_ids`) and exports the engine canary's counters on its own `/metrics` port, so the same
alert (ops/prometheus) fires. Mismatches are kept as JSON lines in `--evidence-dir`.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
import time
from pathlib import Path

import httpx

from sglang_dspark.help_format import DefaultsHelpFormatter

logger = logging.getLogger("sglang_dspark.canary_probe")


def greedy_ids(client: httpx.Client, base_url: str, prompt: str, max_tokens: int) -> list[int]:
    body = {"text": prompt, "sampling_params": {"max_new_tokens": max_tokens, "temperature": 0.0}}
    response = client.post(f"{base_url.rstrip('/')}/generate", json=body)
    response.raise_for_status()
    return list(response.json()["output_ids"])


def probe(dspark_url: str, reference_url: str, prompts: list[str], *, max_tokens: int, metrics,
          evidence_dir: Path | None = None, interval_s: float = 0.0, api_key: str | None = None,
          timeout_s: float = 120.0) -> tuple[int, int]:
    """Compare every prompt once; returns (replays, mismatches). Bounded: one pass over `prompts`."""
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    replays = mismatches = 0
    with httpx.Client(timeout=timeout_s, headers=headers) as client:
        for i, prompt in enumerate(prompts):
            speculative = greedy_ids(client, dspark_url, prompt, max_tokens)
            reference = greedy_ids(client, reference_url, prompt, max_tokens)
            replays += 1
            metrics.canary_replays.inc()
            if speculative != reference:
                mismatches += 1
                metrics.canary_mismatches.inc()
                first = next((j for j, (a, b) in enumerate(zip(speculative, reference)) if a != b),
                             min(len(speculative), len(reference)))
                logger.error("canary: prompt %d decoded differently by the DSpark deployment from token %d on", i, first)
                if evidence_dir is not None:
                    evidence_dir.mkdir(parents=True, exist_ok=True)
                    with open(evidence_dir / "canary_mismatches.jsonl", "a") as f:
                        f.write(json.dumps({"prompt": prompt, "first_difference": first, "speculative": speculative,
                                            "replayed": reference}) + "\n")
            if interval_s:
                time.sleep(interval_s)
    return replays, mismatches


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m sglang_dspark.canary_probe", description=__doc__.splitlines()[0],
                                formatter_class=DefaultsHelpFormatter)
    p.add_argument("--dspark-url", required=True, help="the DSpark deployment (the router), e.g. http://127.0.0.1:30000")
    p.add_argument("--reference-url", required=True, help="a target-only replica of the same model (launch --mode target)")
    p.add_argument("--prompts", default="builtin:heldout", help="prompt source (sglang_dspark.prompts.load_prompts spec)")
    p.add_argument("--max-tokens", type=int, default=64, help="greedy tokens per probe")
    p.add_argument("--rounds", type=int, default=1, help="passes over the prompts (the prober stops after them)")
    p.add_argument("--interval", type=float, default=1.0, metavar="S", help="seconds between probes")
    p.add_argument("--metrics-port", type=int, default=9464, help="port of the prober's own /metrics (0: none)")
    p.add_argument("--evidence-dir", type=Path, help="where mismatches are kept as JSON lines")
    p.add_argument("--api-key", help="Bearer token of both servers")
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    from prometheus_client import start_http_server

    from sglang_dspark.metrics import EngineMetrics
    from sglang_dspark.prompts import load_prompts

    metrics = EngineMetrics()
    if args.metrics_port:
        start_http_server(args.metrics_port, addr="127.0.0.1", registry=metrics.registry)
    try:
        prompts = [r.prompt for r in load_prompts(args.prompts)] * args.rounds
        replays, mismatches = probe(args.dspark_url, args.reference_url, prompts, max_tokens=args.max_tokens,
                                    metrics=metrics, evidence_dir=args.evidence_dir, interval_s=args.interval,
                                    api_key=args.api_key)
    except (httpx.HTTPError, ValueError, KeyError) as exc:
        print(f"error: {type(exc).__name__}: {' '.join(str(exc).split())}", file=sys.stderr)
        return 2
    print(f"{replays} greedy requests compared, {mismatches} mismatches")
    return 1 if mismatches else 0


if __name__ == "__main__":
    sys.exit(main())
