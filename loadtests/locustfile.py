"""`locust -f loadtests/locustfile.py --host URL ...`: the streaming LLM user, defined in
sglang_dspark/loadtest/locustfile.py (package code, so an installed bundle has it too)."""

from sglang_dspark.loadtest.locustfile import LlmStreamingUser  # noqa: F401  (Locust collects it from here)
