"""The native threads that run the engine's torch ops, how many there are, and what set that number.

GNU OpenMP gives every native thread that runs a parallel region its own team of workers, for the
thread's life, and its workers inherit the OS name of the thread that started them. The engine
thread is named `ENGINE_THREAD` at the OS level before it runs any torch op, so the threads carrying
that name are the engine's own team, and `top -H` shows them. A second team (torch work on another
long-lived thread, such as a model conversion on the server's main thread) makes OpenMP throttle
its workers' spinning once the process holds more threads than cores: the engine's steps then wait
on sleeping workers. `EngineThreads.report` counts the team and how often its workers slept, so a
server says which it runs on.
"""

from __future__ import annotations

import ctypes
import os
import sys
import threading
from dataclasses import dataclass

import torch

ENGINE_THREAD = "dspark-engine"  # 15 bytes at most: the kernel's limit for a thread name
_PR_SET_NAME = 15


def name_native_thread(name: str) -> None:
    """Name the calling thread at the OS level (Linux; elsewhere nothing): threads it starts from now
    on, OpenMP's workers among them, carry the name."""
    if sys.platform.startswith("linux"):
        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_NAME, name.encode()[:15], 0, 0, 0)


def native_threads() -> dict[int, tuple[str, int]]:
    """tid -> (OS name, voluntary context switches so far) of every thread of this process (Linux;
    elsewhere empty)."""
    tasks = {}
    for tid in os.listdir("/proc/self/task") if os.path.isdir("/proc/self/task") else ():
        try:
            with open(f"/proc/self/task/{tid}/comm") as f:
                name = f.read().strip()
            with open(f"/proc/self/task/{tid}/status") as f:
                waits = next(int(line.split()[1]) for line in f if line.startswith("voluntary_ctxt_switches"))
        except (OSError, StopIteration):
            continue  # a thread that ended while we looked
        tasks[int(tid)] = (name, waits)
    return tasks


@dataclass(frozen=True)
class EngineThreads:
    """What the launch set up on the engine thread (`set_engine_threads`), reported by /server_info."""

    set_by: str
    native_id: int  # the engine thread's own tid: the others of its name are its OpenMP workers

    def report(self) -> dict:
        """The team as it runs now. `worker_waits`: how often the engine's OpenMP workers went to sleep,
        in all; a healthy team sleeps only when the engine idles, a throttled one at nearly every op."""
        team = {tid: waits for tid, (name, waits) in native_threads().items() if name == ENGINE_THREAD}
        return {
            "torch_threads": torch.get_num_threads(),
            "set_by": self.set_by,
            "cpus_available": len(os.sched_getaffinity(0)),
            "engine_team_native_threads": len(team),
            "worker_waits": sum(w for tid, w in team.items() if tid != self.native_id),
        }


def set_engine_threads(threads: int | None) -> EngineThreads:
    """On the engine thread, before any torch op: name it, set torch's intra-op threads when asked,
    and record what decided their number."""
    name_native_thread(ENGINE_THREAD)
    if threads is not None:
        torch.set_num_threads(threads)
        set_by = f"--threads {threads}"
    else:
        env = next((v for v in ("OMP_NUM_THREADS", "MKL_NUM_THREADS") if os.environ.get(v)), None)
        set_by = (f"{env}={os.environ[env]}" if env else
                  f"torch's default for the {len(os.sched_getaffinity(0))} CPUs this process may use")
    return EngineThreads(set_by, threading.get_native_id())
