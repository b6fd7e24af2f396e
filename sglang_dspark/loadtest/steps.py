"""Concurrency steps: which step a request belongs to (the step in force when it was sent), and
the parsers of the step flags (users per step, how long a step lasts), shared by `run` and the shape.

The load shape (`shape.py`) marks each step's start here, in the master's (or the single local
process's) clock; records reach that same process and are stamped from their send time. Workers on
other machines need clocks in sync (NTP) to well under a step's length.
"""

from __future__ import annotations

import bisect
import re
import time


class StepLog:
    def __init__(self) -> None:
        self._starts: list[float] = []  # Unix times, ascending
        self._steps: list[tuple[int, int]] = []  # (step index, users)

    def mark(self, index: int, users: int, at: float | None = None) -> None:
        self._starts.append(time.time() if at is None else at)
        self._steps.append((index, users))

    def at(self, t_send: float, default_users: int) -> tuple[int, int]:
        """(step index, users) in force at `t_send`; step 0 with `default_users` without a shape
        (a plain `-u N` run is one step)."""
        i = bisect.bisect_right(self._starts, t_send) - 1
        if not self._steps:
            return 0, default_users
        return self._steps[max(i, 0)]  # a request sent a moment before the first mark joins step 0


STEP_LOG = StepLog()


def parse_users(text: str) -> list[int]:
    """"1,4,16" -> [1, 4, 16]; ValueError for anything but positive integers."""
    try:
        users = [int(u) for u in str(text).split(",")]
    except ValueError:
        users = []
    if not users or min(users) < 1:
        raise ValueError(f"users {text!r}: expected positive integers, comma-separated")
    return users


def parse_duration(text: str) -> int:
    """"30s", "2m", "1h30m" or plain seconds -> whole seconds (Locust's -t resolution); ValueError
    for anything else, zero included."""
    match = re.fullmatch(r"(?:(\d+)h)?(?:(\d+)m)?(?:(\d+)s?)?", str(text).strip())
    seconds = match and int(match[1] or 0) * 3600 + int(match[2] or 0) * 60 + int(match[3] or 0)
    if not seconds:
        raise ValueError(f"time {text!r}: expected a positive time such as 30s, 2m or 1h30m")
    return seconds
