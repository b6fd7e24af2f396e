"""Locust event listeners: the `--llm-*` command-line options, and the per-request records' way to
the master.

A worker sends each finished request's record to the master (`runner.send_message`); the master,
or a single local process, stamps it with its concurrency step and keeps it, and when Locust quits
writes them all to `--llm-records`. Imported (never loaded by path) by `locustfile.py` and
`shape.py`, so the listeners are registered once however the locustfiles are given to Locust.
"""

from __future__ import annotations

import argparse
import json
import os
import sys

from locust import events
from locust.runners import MasterRunner, WorkerRunner

from sglang_dspark.loadtest.steps import STEP_LOG, parse_duration, parse_users
from sglang_dspark.loadtest.summary import itl_s, ttft_s, user_tok_s
from sglang_dspark.loadtest.workload import (
    DEFAULT_PROMPTS, ENDPOINT_CHOICES, LENGTH_SPEC_HELP, OutputLength, prompts_by_domain,
)

RECORD_MESSAGE = "sglang_dspark_record"
RECORDS: list[dict] = []  # on the master or the local process: every finished request, stamped


def _checked(parse):
    """argparse `type` that validates but keeps the string (options travel to workers as is)."""
    def check(text: str) -> str:
        try:
            parse(text)
        except ValueError as exc:
            raise argparse.ArgumentTypeError(str(exc)) from None
        return text
    return check


@events.init_command_line_parser.add_listener
def add_arguments(parser) -> None:
    parser.add_argument("--llm-endpoint", choices=ENDPOINT_CHOICES, default="chat",
                        help="chat: /v1/chat/completions, completions: /v1/completions, mixed: either per request")
    parser.add_argument("--llm-model", default="",
                        help="the request's model field (default: left out, so the server's model)")
    parser.add_argument("--llm-prompts", default=DEFAULT_PROMPTS,
                        help="prompt set, any spec sglang_dspark.prompts.load_prompts takes (it must load on "
                             "every worker): builtin:heldout, builtin:eval, mt-bench, sharegpt, a JSONL file, ...")
    parser.add_argument("--llm-domains", default="",
                        help="domains of the prompt set to draw from, comma-separated (default: all of them)")
    parser.add_argument("--llm-max-tokens", type=_checked(OutputLength.parse), default="128",
                        help=f"output tokens per request (ignore_eos is set): {LENGTH_SPEC_HELP}")
    parser.add_argument("--llm-temperature", type=float, default=0.0, help="sampling temperature")
    parser.add_argument("--llm-seed", type=int, default=0, help="seed of every user's prompt and length draws")
    parser.add_argument("--llm-timeout", type=float, default=600.0, help="seconds a request may take in all")
    parser.add_argument("--llm-api-key", default="", is_secret=True, env_var="LOCUST_LLM_API_KEY",
                        help="sent as 'Authorization: Bearer KEY'")
    parser.add_argument("--llm-records", default="", include_in_web_ui=False,
                        help="JSON file the master (or single process) writes every request's record to at exit")
    parser.add_argument("--llm-steps", type=_checked(parse_users), default="1,4,16",
                        help="with shape.py: the users of each concurrency step, comma-separated")
    parser.add_argument("--llm-step-time", type=_checked(parse_duration), default="30s",
                        help="with shape.py: how long each step is held (30s, 2m, 1h30m)")


@events.init.add_listener
def on_init(environment, **_) -> None:
    if isinstance(environment.runner, WorkerRunner):
        return  # its options arrive from the master with the first spawn message
    opts = environment.parsed_options
    if opts is not None:  # check the prompt set here, once, not in every user's on_start
        try:
            prompts_by_domain(opts.llm_prompts, opts.llm_domains)
        except (ValueError, OSError) as exc:
            sys.exit(f"error: --llm-prompts/--llm-domains: {exc}")
    if isinstance(environment.runner, MasterRunner):
        environment.runner.register_message(RECORD_MESSAGE, lambda environment, msg, **_: keep(environment, msg.data))


def keep(environment, record: dict) -> None:
    step, users = STEP_LOG.at(record["t_send"], default_users=environment.runner.target_user_count)
    RECORDS.append({**record, "step": step, "users": users})


def deliver(environment, record: dict) -> None:
    """Fire the METRIC events and send the record where the records are kept."""
    fire_metrics(environment, record)
    if isinstance(environment.runner, WorkerRunner):
        environment.runner.send_message(RECORD_MESSAGE, record)
    else:
        keep(environment, record)


def fire_metrics(environment, record: dict) -> None:
    """Locust METRIC rows ttft_ms, itl_ms (one per gap) and user_tok_s (tok/s, not ms). Locust's
    percentiles round these; the report computes exact ones from the records."""
    def fire(name: str, value: float) -> None:
        environment.events.request.fire(request_type="METRIC", name=name, response_time=value, response_length=0,
                                        exception=None, context={})

    if (ttft := ttft_s(record)) is not None:
        fire("ttft_ms", ttft * 1000)
    for gap in itl_s(record):
        fire("itl_ms", gap * 1000)
    if (speed := user_tok_s(record)) is not None:
        fire("user_tok_s", speed)


@events.quitting.add_listener
def write_records(environment, **_) -> None:
    path = getattr(environment.parsed_options, "llm_records", "")
    if not path or isinstance(environment.runner, WorkerRunner):
        return
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    with open(f"{path}.tmp", "w", encoding="utf-8") as f:
        json.dump(RECORDS, f)
    os.replace(f"{path}.tmp", path)  # a reader never sees half a file
