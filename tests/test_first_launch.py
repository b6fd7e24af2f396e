"""Slow, end to end: a first launch (empty caches, so the model is converted by the launch itself)
serves on the engine's own OpenMP team, as a restart does.

A conversion run in the serving process left its main thread a second OpenMP team, and GNU OpenMP
then put the engine's workers to sleep between nearly every op (engine/threads.py). The count of
those sleeps per decode step is what the server reports and this test reads: close to 0 on a
healthy team, one or more per step on a throttled one, whatever the host's speed."""

import httpx
import pytest

from sglang_dspark.testing.servers import free_port, start_reference_server, stop
from sglang_dspark.zoo import DEFAULT_CACHE

MODEL = "smollm2-135m-instruct"


def threads(port: int) -> dict:
    return httpx.get(f"http://127.0.0.1:{port}/server_info", timeout=30).json()["threads"]


@pytest.mark.slow
def test_a_first_launch_runs_its_steps_on_the_engine_team_alone(tmp_path):
    home = tmp_path / "home"
    home.mkdir()
    converted = home / DEFAULT_CACHE.relative_to("~") / MODEL / ".zoo-complete"
    port = free_port()
    proc = start_reference_server("--model", MODEL, "--mode", "target", port=port, timeout_s=900,
                                  env={"HOME": str(home)})
    try:
        assert converted.is_file(), "the launch did not convert the model: not a first launch"
        assert any("engine threads:" in line for line in proc.startup_lines), "".join(proc.startup_lines[-20:])
        before = threads(port)
        body = {"text": "Write a long story about a dragon.",
                "sampling_params": {"max_new_tokens": 128, "temperature": 0, "ignore_eos": True}}
        assert httpx.post(f"http://127.0.0.1:{port}/generate", json=body, timeout=600).status_code == 200
        after = threads(port)
    finally:
        stop(proc)
    assert after["torch_threads"] == after["engine_team_native_threads"], after  # one team, all of it named
    assert after["set_by"].startswith(("torch's default", "OMP_NUM_THREADS", "MKL_NUM_THREADS")), after
    steps = after["decode_steps"] - before["decode_steps"]
    assert steps >= 100, (before, after)
    waits = after["worker_waits"] - before["worker_waits"]
    assert waits < 0.25 * steps, f"the engine's OpenMP workers slept {waits} times in {steps} steps: {after}"
