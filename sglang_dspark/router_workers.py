"""A replica leaves or joins sglang-router through the router's worker API, and waits until the
router agrees: the pre-stop step of a rolling restart (deploy/: the Kubernetes preStop hook, the
systemd units' ExecStop / ExecStartPost).

    python -m sglang_dspark.router_workers leave --router http://ROUTER:30000 --worker http://HOST:30001
    python -m sglang_dspark.router_workers join  --router http://ROUTER:30000 --worker http://HOST:30001

`leave` removes the worker (DELETE /workers/{id}) so the router sends it nothing new; requests it
already holds go on, and the SIGTERM that follows drains them. `join` adds it (POST /workers) and
returns once the router lists it healthy. Both are idempotent. Exit status 0 once the router agrees,
1 when it does not within --timeout (or cannot be reached), 2 for bad input.
"""

from __future__ import annotations

import argparse
import sys
import time

import httpx

from sglang_dspark.help_format import DefaultsHelpFormatter, OneLineErrorParser

POLL_S = 0.2


class RouterError(Exception):
    """The router refused or did not answer; the message is the one line printed."""


def build_parser() -> argparse.ArgumentParser:
    p = OneLineErrorParser(prog="python -m sglang_dspark.router_workers", description=__doc__.splitlines()[0],
                           formatter_class=DefaultsHelpFormatter)
    sub = p.add_subparsers(dest="action", required=True)
    for action, what in (("leave", "remove the worker from the router; return once it is no longer listed"),
                         ("join", "add the worker to the router; return once it is listed healthy")):
        s = sub.add_parser(action, help=what, description=what, formatter_class=DefaultsHelpFormatter)
        s.add_argument("--router", required=True, metavar="URL", help="the router's base URL (its routing port)")
        s.add_argument("--worker", required=True, metavar="URL",
                       help="the replica's URL exactly as the router lists it, e.g. http://10.0.0.5:30000")
        s.add_argument("--timeout", type=float, default=30.0, metavar="S", help="seconds to wait for the router")
        s.add_argument("--api-key", metavar="KEY", help="the router's admin key, sent as a bearer token")
    return p


def workers(client: httpx.Client, router: str) -> list[dict]:
    r = client.get(f"{router}/workers")
    if r.status_code != 200:
        raise RouterError(f"GET {router}/workers: HTTP {r.status_code} {' '.join(r.text[:160].split())}")
    return r.json().get("workers", [])


def _listed(client: httpx.Client, router: str, worker: str) -> list[dict]:
    return [w for w in workers(client, router) if w.get("url", "").rstrip("/") == worker]


def leave(client: httpx.Client, router: str, worker: str, deadline: float) -> None:
    while True:
        listed = _listed(client, router, worker)
        if not listed:
            return
        for w in listed:
            r = client.delete(f"{router}/workers/{w['id']}")
            if r.status_code not in (200, 202, 404):
                raise RouterError(f"DELETE {router}/workers/{w['id']}: HTTP {r.status_code}")
        if time.monotonic() > deadline:
            raise RouterError(f"{worker} is still listed by {router}")
        time.sleep(POLL_S)


def join(client: httpx.Client, router: str, worker: str, deadline: float) -> None:
    posted = False
    while True:
        listed = _listed(client, router, worker)
        if any(w.get("is_healthy") for w in listed):
            return
        if not listed and not posted:
            r = client.post(f"{router}/workers", json={"url": worker})
            if r.status_code not in (200, 201, 202, 409):
                raise RouterError(f"POST {router}/workers: HTTP {r.status_code} {' '.join(r.text[:160].split())}")
            posted = True
        elif not listed:  # the router drops a worker whose registration failed: ask again
            posted = False
        if time.monotonic() > deadline:
            raise RouterError(f"{router} does not list {worker} as healthy")
        time.sleep(POLL_S)


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.timeout <= 0:
        print(f"error: --timeout {args.timeout}: must be > 0", file=sys.stderr)
        return 2
    router, worker = args.router.rstrip("/"), args.worker.rstrip("/")
    headers = {"Authorization": f"Bearer {args.api_key}"} if args.api_key else {}
    try:
        with httpx.Client(headers=headers, timeout=10) as client:
            (leave if args.action == "leave" else join)(client, router, worker, time.monotonic() + args.timeout)
    except (RouterError, httpx.HTTPError) as exc:
        print(f"error: {args.action} {worker}: {exc}", file=sys.stderr)
        return 1
    print(f"{worker}: {'left' if args.action == 'leave' else 'joined'} {router}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
