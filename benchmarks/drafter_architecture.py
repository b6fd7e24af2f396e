"""Choose the drafter's architecture by measured quality and cost on this CPU.

Each candidate trains for the same minutes on the same data (one thread, two candidates at a time);
quality is the trainer's held-out estimate at the end (teacher-forced tau at T = 0 and 1 on
on-policy held-out sequences), cost is the median drafter call at R = 1 and R = 16
(benchmarks/drafter_speed.py, one thread, measured after training so the CPU is otherwise idle).

    python benchmarks/train_drafter.py arch --minutes 15

Writes benchmarks/results/drafter_architecture.json.
"""

from __future__ import annotations

import json

from train_drafter import RESULTS, RUNS, arch_args, python, run_parallel

CANDIDATES = {  # name -> changes to the shipped architecture (train_drafter.ARCH)
    "2L-r256": {},
    "1L-r256": {"num_layers": 1},
}


def run_candidates(train_command, minutes: float) -> dict:
    names = list(CANDIDATES)
    outs = {n: RUNS / f"arch-{n}" for n in names}
    for i in range(0, len(names), 2):
        run_parallel({f"arch-{n}": train_command(outs[n], minutes, *arch_args(**CANDIDATES[n])) for n in names[i : i + 2]})
    result = {"minutes": minutes, "candidates": {}}
    print(f"{'candidate':<10} {'steps':>6} {'est. tau T=0':>12} {'T=1':>6} {'draft ms R=1':>12} {'R=16':>6}")
    for n in names:
        speed_path = RUNS / f"arch-{n}-speed.json"
        run_parallel({f"arch-speed-{n}": python("benchmarks/drafter_speed.py", "--draft", outs[n], "--threads", 1,
                                                 "--out", speed_path)})
        summary = json.loads((outs[n] / "train_summary.json").read_text())
        speed = json.loads(speed_path.read_text())["ms_per_draft_call"]
        last = summary["heldout"][-1]
        result["candidates"][n] = {"changes": CANDIDATES[n], "steps": summary["steps"], "heldout": last,
                                   "ms_per_draft_call": speed}
        print(f"{n:<10} {summary['steps']:>6} {last['tau_t0']:>12.3f} {last['tau_t1']:>6.3f} "
              f"{speed['R1']['greedy_argmax']:>12.1f} {speed['R16']['greedy_argmax']:>6.1f}")
    (RESULTS / "drafter_architecture.json").write_text(json.dumps(result, indent=2) + "\n")
    return result
