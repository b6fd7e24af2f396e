"""benchmarks/scheduler_takes.py: the best fixed budget is the fastest of target-only, verify-all and the
fixedK arms, and each bar is judged from the runs, not assumed."""

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
from scheduler_takes import summarize  # noqa: E402


def _run(tmp_path, rows):
    path = tmp_path / "run.json"
    path.write_text(json.dumps({"controlled": {"acceptance": 0.7}, "arms": ["target", "full", "default", "fixed1", "fixed2"],
                                "rows": rows}))
    return summarize(path)


def _row(c, speeds, vs_best):
    return {"concurrency": c, "default_vs_best_fixed": vs_best, "default": {"tau": 2.0, "runs_output_tok_s": speeds["default"]},
            **{a: {"runs_output_tok_s": s} for a, s in speeds.items() if a != "default"}}


def test_best_fixed_and_bars(tmp_path):
    low = _row(1, {"target": [100, 100, 100], "full": [90, 95, 92], "default": [150, 140, 145],
                   "fixed1": [120, 125, 118], "fixed2": [160, 150, 155]}, 0.93)
    high = _row(16, {"target": [400, 410, 405], "full": [420, 430, 425], "default": [395, 400, 398],
                     "fixed1": [410, 415, 412], "fixed2": [405, 400, 402]}, 0.95)
    first, last = _run(tmp_path, [low, high])
    assert first["best_fixed_arm"] == "fixed2" and first["vs_target"]["fixed2"] == 1.55
    assert first["bars"] == {"at_least_0.9_of_best_fixed": True, "never_below_target": True}
    assert last["best_fixed_arm"] == "full"
    assert last["bars"] == {"at_least_0.9_of_best_fixed": True, "never_below_target": False, "beats_verify_all": False}
