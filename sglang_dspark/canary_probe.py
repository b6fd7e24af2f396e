"""`python -m sglang_dspark.canary_probe`: the correctness canary for fleets the bundle does not run.

The reference engine replays its own greedy requests (engine/canary.py). An SGLang fleet behind
sglang-router cannot be asked to, so this prober does the same from outside: it sends greedy
requests (held-out prompts) to the DSpark deployment (the router) and to a target-only replica
(`launch --mode target`, kept out of the router), compares the token ids (`/generate`'s
`output_ids`) and exports the engine canary's two counters (and nothing else: the prober is not a
replica) on its own `/metrics` port, so the same alert (ops/prometheus) fires. Mismatches are kept
as JSON lines in `--evidence-dir`.

`--rounds 0` runs until SIGINT / SIGTERM, so the counters stay scrapeable: the way to run it in
production. A bounded run (`--rounds N`) exits 0, 1 on any mismatch, 2 on bad input or a failed
request; a continuous one logs a failed comparison after the first and tries again next round (a
replica restarting during a rollout must not stop the canary), and exits 0 on the signal.
"""

from __future__ import annotations

import argparse
import json
import logging
import re
import signal
import sys
import threading
from pathlib import Path

import httpx
from prometheus_client import CollectorRegistry, Counter, generate_latest

from sglang_dspark.help_format import EXIT_BAD_INPUT, DefaultsHelpFormatter, OneLineErrorParser

logger = logging.getLogger("sglang_dspark.canary_probe")

EXIT_MISMATCH = 1
RETRY_S = 1.0  # the least wait after a failed comparison in a continuous run (no tight loop on a dead server)


class ProbeError(Exception):
    """A comparison that could not be made; the message is one line naming the server's URL.
    `replays` / `mismatches`: what the pass it ended had compared before it."""

    replays = mismatches = 0


class CanaryCounters:
    """The prober's whole exposition: the engine canary's two counters, under the names and help of
    sglang_dspark/metrics.py, in a registry of their own. No queue or running-request gauges: at 0
    they would make the prober a phantom replica in `dspark:num_*_reqs` and on the dashboard."""

    def __init__(self, registry: CollectorRegistry | None = None):
        self.registry = registry or CollectorRegistry()
        self.canary_replays = Counter("sglang_dspark_canary_replays", "Greedy requests replayed without speculation "
                                      "and compared token for token", registry=self.registry)
        self.canary_mismatches = Counter("sglang_dspark_canary_mismatches", "Replays whose tokens differed from the "
                                         "speculative output (should stay 0)", registry=self.registry)

    def render(self) -> bytes:
        return generate_latest(self.registry)


def greedy_ids(client: httpx.Client, base_url: str, prompt: str, max_tokens: int) -> list[int]:
    """The greedy token ids `base_url` decodes for `prompt`; ProbeError naming the URL otherwise."""
    url = f"{base_url.rstrip('/')}/generate"
    body = {"text": prompt, "sampling_params": {"max_new_tokens": max_tokens, "temperature": 0.0}}
    try:
        response = client.post(url, json=body)
    except httpx.HTTPError as exc:
        reason = " ".join(re.sub(r"\[Errno -?\d+\] ", "", str(exc)).split()) or "no answer"
        raise ProbeError(f"POST {url}: {type(exc).__name__}: {reason}") from None
    if response.status_code >= 400:
        raise ProbeError(f"POST {url}: HTTP {response.status_code}: {' '.join(response.text[:200].split())}")
    try:
        ids = response.json()["output_ids"]
        return [int(t) for t in ids]
    except (ValueError, KeyError, TypeError):
        raise ProbeError(f"POST {url}: the answer has no list of output_ids (not an SGLang-compatible "
                         "/generate)") from None


def probe(dspark_url: str, reference_url: str, prompts: list[str], *, max_tokens: int, metrics,
          evidence_dir: Path | None = None, interval_s: float = 0.0, api_key: str | None = None,
          timeout_s: float = 120.0, stop: threading.Event | None = None) -> tuple[int, int]:
    """Compare every prompt once; returns (replays, mismatches). Bounded: one pass over `prompts`,
    `interval_s` between comparisons, ended early when `stop` is set. `metrics` has the two
    counters `canary_replays` and `canary_mismatches` (CanaryCounters, or an EngineMetrics)."""
    stop = stop or threading.Event()
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    replays = mismatches = 0
    with httpx.Client(timeout=timeout_s, headers=headers) as client:
        for i, prompt in enumerate(prompts):
            if stop.is_set():
                break
            try:
                speculative = greedy_ids(client, dspark_url, prompt, max_tokens)
                reference = greedy_ids(client, reference_url, prompt, max_tokens)
            except ProbeError as exc:
                exc.replays, exc.mismatches = replays, mismatches
                raise
            replays += 1
            metrics.canary_replays.inc()
            if speculative != reference:
                mismatches += 1
                metrics.canary_mismatches.inc()
                first = next((j for j, (a, b) in enumerate(zip(speculative, reference)) if a != b),
                             min(len(speculative), len(reference)))
                logger.error("canary: prompt %d decoded differently by %s than by %s from token %d on",
                             i, dspark_url, reference_url, first)
                if evidence_dir is not None:
                    evidence_dir.mkdir(parents=True, exist_ok=True)
                    with open(evidence_dir / "canary_mismatches.jsonl", "a") as f:
                        f.write(json.dumps({"prompt": prompt, "first_difference": first, "speculative": speculative,
                                            "replayed": reference, "dspark_url": dspark_url,
                                            "reference_url": reference_url}) + "\n")
            if interval_s and stop.wait(interval_s):
                break
    return replays, mismatches


def run_rounds(args, prompts: list[str], metrics, stop: threading.Event) -> tuple[int, int]:
    """`args.rounds` passes over `prompts` (0: until `stop`). A failed comparison ends a bounded run
    (ProbeError); a continuous run ends only on the first one (a wrong URL, a server that is not
    SGLang-compatible), later ones are logged and the next round tries again."""
    replays = mismatches = rounds = 0
    while not stop.is_set() and (args.rounds == 0 or rounds < args.rounds):
        try:
            r, m = probe(args.dspark_url, args.reference_url, prompts, max_tokens=args.max_tokens, metrics=metrics,
                         evidence_dir=args.evidence_dir, interval_s=args.interval, api_key=args.api_key,
                         timeout_s=args.timeout, stop=stop)
        except ProbeError as exc:
            replays, mismatches = replays + exc.replays, mismatches + exc.mismatches
            if args.rounds or not replays:
                raise
            retry_s = max(args.interval, RETRY_S)
            logger.error("canary: %s; trying again in %g s", exc, retry_s)
            stop.wait(retry_s)
            continue
        replays, mismatches, rounds = replays + r, mismatches + m, rounds + 1
    return replays, mismatches


def _port(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = -1
    if not 0 <= value <= 65535:
        raise argparse.ArgumentTypeError(f"{text!r} is not a TCP port (0 to 65535; 0: no /metrics)")
    return value


def build_parser() -> argparse.ArgumentParser:
    p = OneLineErrorParser(prog="python -m sglang_dspark.canary_probe", description=__doc__.splitlines()[0],
                           formatter_class=DefaultsHelpFormatter)
    p.add_argument("--dspark-url", required=True, help="the DSpark deployment (the router), e.g. http://127.0.0.1:30000")
    p.add_argument("--reference-url", required=True, help="a target-only replica of the same model (launch --mode target)")
    p.add_argument("--prompts", default="builtin:heldout", help="prompt source (sglang_dspark.prompts.load_prompts spec)")
    p.add_argument("--max-tokens", type=int, default=64, help="greedy tokens per probe")
    p.add_argument("--rounds", type=int, default=1,
                   help="passes over the prompts, then exit (1 on a mismatch); 0: run until SIGINT / SIGTERM, "
                        "so Prometheus keeps scraping the counters (production)")
    p.add_argument("--interval", type=float, default=1.0, metavar="S", help="seconds between probes")
    p.add_argument("--timeout", type=float, default=120.0, metavar="S", help="seconds one /generate request may take")
    p.add_argument("--metrics-host", default="127.0.0.1", metavar="ADDR",
                   help="address of the prober's own /metrics; a Prometheus on another host needs 0.0.0.0 (or "
                        "this host's address)")
    p.add_argument("--metrics-port", type=_port, default=9464, help="port of the prober's own /metrics (0: none)")
    p.add_argument("--evidence-dir", type=Path, help="where mismatches are kept as JSON lines")
    p.add_argument("--api-key", help="Bearer token of both servers")
    return p


def _check(args) -> None:
    """ValueError `--flag V: must be ...` for the first value out of range."""
    for flag, value, ok, want in (("--rounds", args.rounds, args.rounds >= 0, ">= 0 (0: until SIGINT / SIGTERM)"),
                                  ("--max-tokens", args.max_tokens, args.max_tokens >= 1, ">= 1"),
                                  ("--interval", args.interval, args.interval >= 0, ">= 0"),
                                  ("--timeout", args.timeout, args.timeout > 0, "> 0")):
        if not ok:
            raise ValueError(f"{flag} {value:g}: must be {want}")


def _serve_metrics(args, metrics: CanaryCounters):
    """The /metrics server (None without a port); ValueError, one line, when it cannot listen."""
    if not args.metrics_port:
        return None
    from prometheus_client import start_http_server

    try:
        server, _ = start_http_server(args.metrics_port, addr=args.metrics_host, registry=metrics.registry)
    except OSError as exc:  # the port in use, an address not of this host
        reason = exc.strerror or " ".join(str(exc).split())
        raise ValueError(f"--metrics-host {args.metrics_host} --metrics-port {args.metrics_port}: cannot listen "
                         f"({reason})") from None
    return server


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    from sglang_dspark.prompts import load_prompts

    try:
        _check(args)
        try:
            prompts = [r.prompt for r in load_prompts(args.prompts)]
        except (ValueError, OSError) as exc:
            raise ValueError(f"--prompts {args.prompts}: {' '.join(str(exc).split())}") from None
        if not prompts:
            raise ValueError(f"--prompts {args.prompts}: no prompts")
        metrics = CanaryCounters()
        server = _serve_metrics(args, metrics)
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_BAD_INPUT

    stop = threading.Event()
    previous = {sig: signal.signal(sig, lambda *_: stop.set()) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        if server is not None:
            logger.info("canary counters on http://%s:%d/metrics", args.metrics_host, args.metrics_port)
        replays, mismatches = run_rounds(args, prompts, metrics, stop)
    except ProbeError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_BAD_INPUT
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        if server is not None:
            server.shutdown()
            server.server_close()
    print(f"{replays} greedy requests compared, {mismatches} mismatches"
          + (" (stopped by a signal)" if stop.is_set() else ""))
    if args.rounds == 0:  # the counters were the report: Prometheus has them
        return 0
    return EXIT_MISMATCH if mismatches else 0


if __name__ == "__main__":
    sys.exit(main())
