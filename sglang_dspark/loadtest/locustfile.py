"""Locust user for OpenAI-compatible streaming LLM servers (SGLang, sglang-router, the reference server).

    locust -f loadtests/locustfile.py --host http://127.0.0.1:30000 --headless -u 4 -r 4 -t 60s \\
        --stop-timeout 120 --llm-max-tokens 128 --llm-records records.json
    locust -f loadtests/locustfile.py,loadtests/shape.py --host ... --headless --llm-steps 1,4,16 --llm-step-time 30s

Each user streams one request after another (closed loop, so concurrency = users). Without
--stop-timeout Locust cuts off the requests in flight when the run time is up, and drops them.
Per request it records TTFT, the arrival of every content chunk and the output tokens from the
usage chunk, and from them per-user speed (n_out - 1) / (t_last - t_first) (definitions: `summary.py`). Locust's own
row for the request gets the full stream time and its bytes (for a streamed body Locust would
record time to headers and length 0), and METRIC rows ttft_ms, itl_ms and user_tok_s are fired.
Records go to the master (`locust_hooks.py`), so a distributed run (--master / --worker) works
unchanged.

The `--llm-*` options (endpoint, model, prompt set and domains, max tokens, temperature, seed, timeout, API key,
records file, shape steps) are defined with their help and defaults in
sglang_dspark/loadtest/locust_hooks.py. Locust 2.47 prints `--help` before it imports a
locustfile, so they do not show there; its web UI lists them among the custom parameters.

HttpUser, not FastHttpUser: the latter reads 1 KB at a time, which holds back small SSE events and
misreports time to first token.
"""

from __future__ import annotations

import itertools
import random
import time

import requests
from locust import HttpUser, constant, task

from sglang_dspark.loadtest import locust_hooks
from sglang_dspark.loadtest.sse import StreamResult, read_sse
from sglang_dspark.loadtest.workload import OutputLength, PlannedRequest, Workload, prompts_by_domain


class LlmStreamingUser(HttpUser):
    wait_time = constant(0)
    _numbers = itertools.count()  # per process; with the worker index it names the user's seed

    def on_start(self) -> None:
        opts = self.environment.parsed_options
        self.worker = getattr(self.environment.runner, "worker_index", 0)
        rng = random.Random(f"{opts.llm_seed}/{self.worker}/{next(self._numbers)}")
        self.workload = Workload(rng, prompts=prompts_by_domain(opts.llm_prompts, opts.llm_domains),
                                 output_length=OutputLength.parse(opts.llm_max_tokens), endpoint=opts.llm_endpoint,
                                 model=opts.llm_model, temperature=opts.llm_temperature)
        self.headers = {"Authorization": f"Bearer {opts.llm_api_key}"} if opts.llm_api_key else {}
        self.timeout = opts.llm_timeout

    @task
    def stream_one(self) -> None:
        locust_hooks.deliver(self.environment, self.stream(self.workload.next_request()))

    def stream(self, planned: PlannedRequest) -> dict:
        t_send, t0 = time.time(), time.perf_counter()
        result, error = StreamResult(), None
        with self.client.post(planned.path, json=planned.body, headers=self.headers, stream=True,
                              catch_response=True, timeout=self.timeout) as resp:
            if resp.status_code != 200:
                error = str(resp.error) if resp.status_code == 0 else f"HTTP {resp.status_code}: {resp.text[:200]}"
            else:
                try:
                    result = read_sse(((time.perf_counter(), line) for line in resp.iter_lines()), t0)
                    error = result.error or (None if result.done else "stream ended before [DONE]")
                except requests.RequestException as exc:  # the connection broke mid-stream
                    error = f"{type(exc).__name__}: {exc}"
            total_s = time.perf_counter() - t0
            resp.request_meta["response_time"] = total_s * 1000
            resp.request_meta["response_length"] = result.bytes
            if error:
                resp.failure(error)
            else:
                resp.success()
        usage_seen = result.completion_tokens is not None
        return {
            "endpoint": planned.endpoint, "domain": planned.domain, "prompt_index": planned.prompt_index,
            "max_tokens": planned.max_tokens, "worker": self.worker, "t_send": t_send, "total_s": total_s,
            "ok": error is None, "error": error, "chunk_s": result.chunk_s,
            # without a usage chunk, content chunks are the best count there is (a lower bound)
            "n_out": result.completion_tokens if usage_seen else len(result.chunk_s), "usage_seen": usage_seen,
        }
