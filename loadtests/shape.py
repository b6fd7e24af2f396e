"""`locust -f loadtests/locustfile.py,loadtests/shape.py ...`: concurrency steps, defined in
sglang_dspark/loadtest/shape.py (`--llm-steps 1,4,16 --llm-step-time 30s`)."""

from sglang_dspark.loadtest.shape import ConcurrencySteps  # noqa: F401  (Locust collects it from here)
