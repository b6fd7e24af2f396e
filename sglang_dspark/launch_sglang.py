"""The SGLang launch command for a DSpark deployment (GPU path), built from our launcher's options.

Mode -> SGLang: "target" runs plain SGLang (no speculation); "full" is DSpark with
SGLANG_RAGGED_VERIFY_MODE=static (verify every draft, scheduler off); "scheduled" is DSpark with
`compact` (ragged verify sized by the SPS-table scheduler).
"""

from __future__ import annotations

import os
import shlex
import sys

VERIFY_MODE = {"full": "static", "scheduled": "compact"}


def build_command(model: str, draft: str | None, mode: str, host: str, port: int, *,
                  max_running: int | None = None, max_len: int | None = None, seed: int | None = None,
                  sps_path: str | None = None, sts_path: str | None = None,
                  served_model_name: str | None = None, api_key: str | None = None,
                  admin_api_key: str | None = None) -> tuple[list[str], dict[str, str]]:
    """(argv, extra environment) for `python -m sglang.launch_server`."""
    argv = [sys.executable, "-m", "sglang.launch_server", "--model-path", model,
            "--host", host, "--port", str(port), "--enable-metrics"]
    env: dict[str, str] = {}
    if mode != "target":
        if draft is None:
            raise ValueError(f"mode {mode!r} needs a drafter (--draft)")
        argv += ["--speculative-algorithm", "DSPARK", "--speculative-draft-model-path", draft]
        if sps_path:
            argv += ["--speculative-dspark-sps-table-path", sps_path]
        if sts_path:
            argv += ["--speculative-dspark-confidence-sts-path", sts_path]
        env["SGLANG_RAGGED_VERIFY_MODE"] = VERIFY_MODE[mode]
    if max_running is not None:
        argv += ["--max-running-requests", str(max_running)]
    if max_len is not None:
        argv += ["--context-length", str(max_len)]
    if seed is not None:
        argv += ["--random-seed", str(seed)]
    if served_model_name:
        argv += ["--served-model-name", served_model_name]
    for flag, key in (("--api-key", api_key), ("--admin-api-key", admin_api_key)):
        if key:
            argv += [flag, key]
    return argv, env


def render(argv: list[str], env: dict[str, str]) -> str:
    """One shell line a human can paste."""
    return " ".join([f"{k}={shlex.quote(v)}" for k, v in sorted(env.items())] + [shlex.quote(a) for a in argv])


def exec_command(argv: list[str], env: dict[str, str]) -> None:
    """Replace this process with SGLang's server, so signals and exit codes are SGLang's own."""
    os.execvpe(argv[0], argv, {**os.environ, **env})
