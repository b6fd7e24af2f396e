"""Checks that need a fresh Python process with SGLang imported, without paying the import each
time: one parent process imports the given modules once (SGLang's plugin loader and the modules
the plugin hooks take about 13 s on a small CPU), then forks a child per check. Each child starts
from that freshly imported, unpatched state, as a new `python -c` would after the same imports,
and its exit status, stdout and stderr come back as a CompletedProcess."""

from __future__ import annotations

import json
import os
import select
import signal
import subprocess
import sys
import tempfile
import textwrap
from pathlib import Path

PARENT = r"""
import importlib, json, os, sys, traceback
for name in json.loads(sys.argv[1]):
    importlib.import_module(name)
print("ready", flush=True)
for line in sys.stdin:
    job = json.loads(line)
    pid = os.fork()
    if pid == 0:  # the check: its own output files and environment, then exit with its status
        for fd, path in ((1, job["stdout"]), (2, job["stderr"])):
            os.dup2(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC), fd)
        os.environ.update(job["env"])
        status = 0
        try:
            exec(compile(job["code"], "<check>", "exec"), {"__name__": "__main__"})
        except SystemExit as exc:
            status = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
        except BaseException:
            traceback.print_exc()
            status = 1
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(status)
    _, wait = os.waitpid(pid, 0)
    print(json.dumps(os.waitstatus_to_exitcode(wait)), flush=True)
"""


class ForkedPython:
    """`run(code)` executes `code` in a child forked from a parent that imported `modules`."""

    def __init__(self, modules: list[str], env: dict[str, str] | None = None, timeout: float = 300.0):
        self.timeout, self._dir = timeout, tempfile.TemporaryDirectory(prefix="forked_python_")
        self._proc = subprocess.Popen([sys.executable, "-c", PARENT, json.dumps(modules)], text=True,
                                      stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                      env={**os.environ, **(env or {})}, start_new_session=True)
        ready = self._readline()
        if ready.strip() != "ready":
            raise RuntimeError(f"the parent process failed to import {modules}: {self._proc.stderr.read()[-3000:]}")
        self._count = 0

    def run(self, code: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
        self._count += 1
        out, err = (Path(self._dir.name) / f"{self._count}.{name}" for name in ("out", "err"))
        job = {"code": textwrap.dedent(code), "env": env or {}, "stdout": str(out), "stderr": str(err)}
        self._proc.stdin.write(json.dumps(job) + "\n")
        self._proc.stdin.flush()
        line = self._readline()
        if not line:
            raise RuntimeError(f"the parent process died: {self._proc.stderr.read()[-3000:]}")
        return subprocess.CompletedProcess(["<forked>"], json.loads(line), out.read_text(), err.read_text())

    def _readline(self) -> str:
        """The parent's next line; after `timeout` s without one, the parent and its child are killed."""
        if not select.select([self._proc.stdout], [], [], self.timeout)[0]:
            os.killpg(self._proc.pid, signal.SIGKILL)
            raise TimeoutError(f"no answer from the forked check within {self.timeout:g} s")
        return self._proc.stdout.readline()

    def close(self) -> None:
        """Kill the parent (its checks are done; an orderly exit of an interpreter holding SGLang
        takes seconds) and drop the output files."""
        os.killpg(self._proc.pid, signal.SIGKILL)
        self._proc.wait(timeout=30)
        for pipe in (self._proc.stdin, self._proc.stdout, self._proc.stderr):
            pipe.close()
        self._dir.cleanup()
