"""The row kernels' tests again, on a build with AddressSanitizer and libstdc++'s bounds assertions
(SGLANG_DSPARK_CPU_KERNELS_CHECKED=1, engine/cpu/cpu_rows.py): an index the Python side computes
that runs past a tensor is a crash with a report here, not a silently wrong row. The tests cover
rows and context lengths at every tile edge and the cache's last position (tests/test_cpu_rows.py,
tests/test_draft_rows.py). Slow: a separate build (about a minute) and a sanitized run."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from sglang_dspark.engine.cpu.cpu_rows import CHECKED_ENV, REQUIRED_FLAGS, cpu_flags

ROOT = Path(__file__).resolve().parent.parent


def _gcc_file(name: str) -> str:
    return subprocess.run(["gcc", f"-print-file-name={name}"], capture_output=True, text=True, check=True).stdout.strip()


@pytest.mark.slow
def test_the_row_kernels_pass_their_tests_under_address_sanitizer(tmp_path):
    missing = [f for f in REQUIRED_FLAGS if f not in cpu_flags()]
    if missing:
        pytest.skip(f"this CPU lacks {', '.join(missing)}: the row kernels do not run here at all")
    # triton's extension throws through a static libstdc++ that ASan's interceptor cannot reach: hide it
    hidden = tmp_path / "hidden" / "triton"
    hidden.mkdir(parents=True)
    (hidden / "__init__.py").write_text("raise ImportError('triton is hidden under AddressSanitizer')\n")
    report = tmp_path / "asan"
    env = {**os.environ, CHECKED_ENV: "1", "PYTHONPATH": str(hidden.parent),
           # libstdc++ preloaded too, so C++ exceptions (TORCH_CHECK) resolve the real __cxa_throw
           "LD_PRELOAD": f"{_gcc_file('libasan.so')} {_gcc_file('libstdc++.so.6')}",
           "ASAN_OPTIONS": f"detect_leaks=0:abort_on_error=0:log_path={report}"}
    run = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:xdist", "-p", "no:cacheprovider",
                          "tests/test_cpu_rows.py", "tests/test_draft_rows.py"],
                         cwd=ROOT, env=env, capture_output=True, text=True, timeout=1800)
    reports = "\n".join(p.read_text()[:4000] for p in tmp_path.glob("asan*"))
    assert run.returncode == 0 and not reports, (run.stdout[-3000:], run.stderr[-2000:], reports)
    assert " passed" in run.stdout and "failed" not in run.stdout
