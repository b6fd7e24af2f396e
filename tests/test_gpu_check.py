"""benchmarks/gpu_check.py on a CPU: its arguments (bad ones exit 2 with one line) and the clean exit
where there is no CUDA device. The checks themselves need a GPU (run it where a device is lent)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[1] / "benchmarks" / "gpu_check.py"


def _run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(SCRIPT), *args], capture_output=True, text=True, timeout=120,
                          env={"PATH": "/usr/bin:/bin", "CUDA_VISIBLE_DEVICES": ""})


def test_help_explains_every_flag():
    done = _run("--help")
    assert done.returncode == 0
    for flag in ("--replays", "--max-batch", "--vocab", "--repeats", "--out"):
        assert flag in done.stdout


@pytest.mark.parametrize("args, message", [(("--replays", "0"), "--replays 0: must be >= 1"),
                                           (("--max-batch", "x"), "--max-batch"),
                                           (("--vocab", "1"), "--vocab 1: must be >= 2"),
                                           (("--nope",), "unrecognized arguments")])
def test_bad_arguments_exit_2_with_one_line(args, message):
    done = _run(*args)
    err = done.stderr.strip()
    assert done.returncode == 2 and message in err and "\n" not in err, err


def test_without_cuda_it_says_so_and_exits_cleanly(tmp_path):
    out = tmp_path / "result.json"
    done = _run("--out", str(out))
    assert done.returncode == 0 and "no CUDA device here" in done.stdout, done.stderr
    assert not out.exists()  # nothing was measured
