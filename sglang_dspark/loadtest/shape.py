"""Locust load shape: concurrency steps (users 1, 4, 16, ...), each held for a fixed time.

    locust -f loadtests/locustfile.py,loadtests/shape.py --host URL --headless \\
        --llm-steps 1,4,16 --llm-step-time 30s --llm-records records.json

Each step starts all its users at once and marks its start in `steps.STEP_LOG`, so every record
says which step it was sent in (`step`, `users`). Requests still running when a step ends finish
under the next step's load but count in the step they were sent in. The test stops after the last
step. (`python -m sglang_dspark.loadtest run` runs one Locust process per step instead, so no
request straddles two steps.)
"""

from __future__ import annotations

from locust import LoadTestShape

from sglang_dspark.loadtest import locust_hooks  # noqa: F401  (the --llm-* options and the record sink)
from sglang_dspark.loadtest.steps import STEP_LOG, parse_duration, parse_users


class ConcurrencySteps(LoadTestShape):
    def __init__(self) -> None:
        super().__init__()
        self._current = -1

    def tick(self) -> tuple[int, float] | None:
        opts = self.runner.environment.parsed_options
        steps, hold_s = parse_users(opts.llm_steps), parse_duration(opts.llm_step_time)
        index = int(self.get_run_time() // hold_s)
        if index >= len(steps):
            return None
        if index != self._current:
            STEP_LOG.mark(index, steps[index])
            self._current = index
        return steps[index], steps[index]  # spawn rate = users: a step starts at once
