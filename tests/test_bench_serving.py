"""Slow: a client no one here wrote. SGLang's own load generator, `python -m sglang.bench_serving`
(sglang==0.5.23), runs against the reference server (`python -m sglang_dspark.launch`, drafting on
every step) with its native backend (/generate) and its chat backend (/v1/chat/completions), on its
`random-ids` dataset (prompts of random token ids, no download), with the server's local tokenizer.
Its own result file must report every request completed, none with an error, every request's
token count as the server reported it (usage / meta_info) equal to what it asked for, and the
accept length it reads from /server_info."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
from drafter_fixtures import write_tiny_model_dirs
from sglang_dspark.testing.servers import free_port, start_reference_server, stop

pytestmark = [pytest.mark.slow, pytest.mark.sglang]

NUM_PROMPTS, INPUT_LEN, OUTPUT_LEN = 8, 16, 8
MAX_RUNNING = 4  # below NUM_PROMPTS, so some requests wait for a slot


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    target, draft = write_tiny_model_dirs(tmp_path_factory.mktemp("models"))
    port = free_port()
    proc = start_reference_server("--model", target, "--draft", draft, "--engine", "reference", "--mode", "full",
                                  "--max-running", str(MAX_RUNNING), port=port)
    try:
        yield port, target
    finally:
        stop(proc)


@pytest.mark.parametrize("backend", ["sglang", "sglang-oai-chat"])
def test_sglang_bench_serving_completes_every_request(served, backend, tmp_path):
    port, tokenizer_dir = served
    out = tmp_path / "bench.jsonl"
    cmd = [sys.executable, "-m", "sglang.bench_serving", "--backend", backend, "--host", "127.0.0.1",
           "--port", str(port), "--tokenizer", tokenizer_dir, "--dataset-name", "random-ids",
           "--num-prompts", str(NUM_PROMPTS), "--random-input-len", str(INPUT_LEN),
           "--random-output-len", str(OUTPUT_LEN), "--random-range-ratio", "1.0",
           "--ready-check-timeout-sec", "30",
           # the chat backend counts tokens from usage only when the server streams it
           "--extra-request-body", json.dumps({"stream_options": {"include_usage": True}})
           if backend == "sglang-oai-chat" else "{}",
           "--output-file", str(out), "--output-details", "--disable-tqdm"]
    proc = subprocess.run(cmd, cwd=tmp_path, capture_output=True, text=True, timeout=300,
                          env={**os.environ, "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1"})
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    result = json.loads(out.read_text().splitlines()[-1])
    assert result["backend"] == backend and result["dataset_name"] == "random-ids"
    assert result["errors"] == [""] * NUM_PROMPTS, result["errors"]
    assert result["completed"] == NUM_PROMPTS
    # ignore_eos (sent by bench_serving) honoured and max tokens kept, per the server's own counts
    assert result["output_lens"] == [OUTPUT_LEN] * NUM_PROMPTS, result["output_lens"]
    assert result["total_input_tokens"] == NUM_PROMPTS * INPUT_LEN
    assert all(result["generated_texts"]), result["generated_texts"]
    # read from /server_info's internal_states[0].avg_spec_accept_length (drafting is on)
    assert result["accept_length"] is not None and result["accept_length"] >= 1.0, result["accept_length"]
