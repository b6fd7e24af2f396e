"""benchmarks/peer_llamacpp.py's arithmetic on hand-made samples (the benchmark itself needs a
compiled llama.cpp and minutes; its summary is what the README quotes)."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))

from peer_llamacpp import summarize  # noqa: E402


def test_summary_is_the_median_speed_and_the_median_of_paired_ratios():
    def req(tokens, seconds):
        return {"tokens": tokens, "seconds": seconds}

    samples = {
        "llamacpp": [[req(100, 1.0), req(50, 1.0)], [req(100, 2.0), req(90, 1.0)]],  # 100, 50, 50, 90 tok/s
        "ours": [[req(50, 1.0), req(50, 0.5)], [req(25, 1.0), req(90, 0.5)]],  # 50, 100, 25, 180 tok/s
    }
    table = summarize(samples)
    assert table["llamacpp"] == {"median_tok_s": 70.0, "requests": 4, "completion_tokens": 340, "vs_llamacpp": 1.0}
    # paired ratios 0.5, 2.0, 0.5, 2.0 -> median 1.25; unpaired medians would say 75 / 70
    assert table["ours"]["vs_llamacpp"] == 1.25 and table["ours"]["median_tok_s"] == 75.0
