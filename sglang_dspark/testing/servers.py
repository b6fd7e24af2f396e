"""Servers in subprocesses, on loopback only (slow tests and the serving benchmarks): a free port, a
reference server started through `python -m sglang_dspark.launch` and waited for, a process group
stopped on exit, and busy processes to contend with it."""

from __future__ import annotations

import collections
import contextlib
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

from sglang_dspark.server.runner import READY_PREFIX

ROOT = Path(__file__).resolve().parents[2]  # the checkout, where `python -m sglang_dspark` runs


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_reference_server(*launch_args: str, port: int, timeout_s: float = 180.0,
                           env: dict[str, str] | None = None) -> subprocess.Popen:
    """`python -m sglang_dspark.launch ... --port PORT` in its own process group, returned once it
    printed its ready line (AssertionError with its last output if it never does); `env` is added
    to this process's environment (e.g. an empty HOME: a first launch)."""
    proc = subprocess.Popen([sys.executable, "-m", "sglang_dspark.launch", *launch_args, "--host", "127.0.0.1",
                             "--port", str(port)], cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True, start_new_session=True, env={**os.environ, "HF_HUB_OFFLINE": "1", **(env or {})})
    lines: list[str] = []
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        line = proc.stdout.readline()
        if not line:  # end of output: the process is exiting
            proc.wait(timeout=30)
            break
        lines.append(line)
        if READY_PREFIX in line:
            proc.startup_lines = lines  # the launch log up to the ready line
            proc.log_tail = collections.deque(maxlen=200)  # what it logs while serving, drained so it never blocks
            threading.Thread(target=proc.log_tail.extend, args=(proc.stdout,), daemon=True).start()
            return proc
    stop(proc)
    raise AssertionError("server did not become ready:\n" + "".join(lines[-30:]))


def stop(proc: subprocess.Popen, sig: int = signal.SIGTERM, timeout_s: float = 60.0) -> int:
    """Signal the process group; kill it if it outlives `timeout_s`. Returns the exit code."""
    if proc.poll() is None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, sig)
        try:
            proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=10)
    return proc.returncode


def busy_cpus(seconds: float = 900.0) -> list[subprocess.Popen]:
    """One busy process per CPU this process may run on, each spinning until it is stopped or
    `seconds` pass (bounded: a test that dies leaves nothing spinning for long)."""
    spin = f"import time\nend = time.monotonic() + {seconds}\nwhile time.monotonic() < end:\n    pass\n"
    return [subprocess.Popen([sys.executable, "-c", spin], start_new_session=True)
            for _ in range(len(os.sched_getaffinity(0)))]
