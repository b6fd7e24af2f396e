"""Run one headless Locust test as subprocesses: a single process, or a master and N workers on loopback.

The CLI never imports Locust itself (it monkey-patches the whole process with gevent); it starts
`python -m locust` on the package's locustfile and reads back the files that Locust writes at exit:
the per-request records (`--llm-records`) and Locust's own stats (`--json-file`).
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

LOCUSTFILE = Path(__file__).with_name("locustfile.py")
START_SLACK_S = 60  # Locust's start-up, the workers' connection and its shutdown, beyond the run time
# When the run time is up, requests in flight run to completion (up to this long) instead of being cut
# off: a slow host still records what a step sent, and long requests are not dropped in favour of short.
STOP_TIMEOUT_S = 120


@dataclass(frozen=True)
class StepFiles:
    records: Path
    locust_json: Path
    log: Path


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_locust(*, host: str, users: int, duration_s: int, out_dir: Path, llm_options: list[str],
               api_key: str | None = None, workers: int = 0) -> tuple[int, StepFiles]:
    """Run `users` users for `duration_s` and wait (bounded); returns the master's exit code and files."""
    out_dir.mkdir(parents=True, exist_ok=True)
    files = StepFiles(out_dir / "records.json", out_dir / "locust.json", out_dir / "locust.log")
    for stale in (files.records, files.locust_json):
        stale.unlink(missing_ok=True)
    locust = [sys.executable, "-m", "locust", "-f", str(LOCUSTFILE)]
    main = [*locust, "--headless", "--host", host, "-u", str(users), "-r", str(users), "-t", f"{duration_s}s",
            "--stop-timeout", str(STOP_TIMEOUT_S), "--only-summary", "--exit-code-on-error", "0",
            "--json-file", str(files.locust_json.with_suffix("")),
            "--llm-records", str(files.records), *llm_options]
    env = {**os.environ, "LOCUST_LLM_API_KEY": api_key or ""}  # not on the command line, where ps shows it
    worker_cmds = []
    if workers:
        port = _free_port()
        main += ["--master", "--master-bind-host", "127.0.0.1", "--master-bind-port", str(port),
                 "--expect-workers", str(workers), "--expect-workers-max-wait", str(START_SLACK_S // 2)]
        worker_cmds = [[*locust, "--worker", "--master-host", "127.0.0.1", "--master-port", str(port)]] * workers
    with open(files.log, "wb") as log:
        procs = [subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env)
                 for cmd in [main, *worker_cmds]]
        deadline = time.monotonic() + duration_s + STOP_TIMEOUT_S + START_SLACK_S
        try:
            for proc in procs:  # TimeoutExpired past the deadline; everything is killed on the way out
                proc.wait(timeout=max(0.1, deadline - time.monotonic()))
        finally:
            for proc in procs:
                if proc.poll() is None:
                    proc.kill()
                    proc.wait()
    return procs[0].returncode, files
