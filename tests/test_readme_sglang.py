"""README's "Serving on SGLang": every command in the section runs here, on a CPU, as a user would
type it, with MODEL and DRAFT bound to local directories. Launch commands run with `--dry-run`
(they need a GPU) and every SGLang command they print parses with SGLang's ServerArgs; the capture
command parses with our profile CLI; the router command with the router's own parser. A command
this test does not know how to check fails it."""

from __future__ import annotations

import argparse
import os
import re
import shlex
import subprocess
import sys
import tomllib
from importlib import metadata
from pathlib import Path

import pytest
from test_launch_sglang import printed_nodes
from test_profiles import make_model_dirs, make_profile

from sglang_dspark import launch

pytestmark = pytest.mark.sglang

ROOT = Path(__file__).resolve().parents[1]


def section_commands() -> tuple[dict[str, str], list[list[str]]]:
    """(variables assigned, commands as argv) of the section's bash blocks, continuations joined."""
    text = (ROOT / "README.md").read_text()
    section = re.search(r"^## Serving on SGLang\n(.*?)(?=^## )", text, re.S | re.M).group(1)
    variables, commands = {}, []
    for block in re.findall(r"```bash\n(.*?)```", section, re.S):
        for line in block.replace("\\\n", " ").splitlines():
            words = shlex.split(line, comments=True)
            if len(words) == 1 and re.fullmatch(r"[A-Z_]+=\S+", words[0]):
                key, _, value = words[0].partition("=")
                variables[key] = value
            elif words:
                commands.append(words)
    return variables, commands


@pytest.fixture
def bound(tmp_path, monkeypatch):
    """MODEL and DRAFT bound to tiny local directories; the working directory and HOME in tmp."""
    target, draft = make_model_dirs(tmp_path, gamma=3)
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.delenv("SGLANG_PLUGINS", raising=False)
    return {"MODEL": str(target), "DRAFT": str(draft), "SHARED": str(tmp_path / "shared")}


def _substitute(words: list[str], values: dict[str, str]) -> list[str]:
    return [re.sub(r"\$([A-Z_]+)", lambda m: values[m.group(1)], w) for w in words]


def _flag(words: list[str], name: str, default: str | None = None) -> str | None:
    return words[words.index(name) + 1] if name in words else default


def _server_args_parser():
    from sglang.srt.server_args import ServerArgs

    parser = argparse.ArgumentParser(exit_on_error=False)
    ServerArgs.add_cli_args(parser)
    return parser, ServerArgs


def _check_pip_install(words: list[str]) -> None:
    """The extras exist in pyproject.toml, and what they install is what this venv runs."""
    spec = words[-1]
    extras = re.fullmatch(r"\.\[([a-z,]+)\]", spec).group(1).split(",")
    declared = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    for extra in extras:
        assert extra in declared, f"{spec}: no extra {extra!r} in pyproject.toml"
        for requirement in declared[extra]:
            name, _, version = requirement.partition("==")
            assert metadata.version(name) == version, requirement


def _check_plugin(words: list[str]) -> None:
    done = subprocess.run([sys.executable, *words[1:]], capture_output=True, text=True, cwd=ROOT,
                          env={**os.environ, "HF_HUB_OFFLINE": "1"})
    assert done.returncode == 0 and "registers its hooks" in done.stdout, done.stdout + done.stderr


def _check_launch(words: list[str], values: dict[str, str], capsys) -> None:
    argv = words[3:]
    profile = _flag(argv, "--profile")
    if profile is not None:  # the profile this deployment's capture would have written, for this host
        tp, dp = int(_flag(argv, "--tp", "1")), int(_flag(argv, "--dp", "1"))
        Path(profile).parent.mkdir(parents=True, exist_ok=True)
        make_profile(engine="sglang", target_dir=values["MODEL"], draft_dir=values["DRAFT"], tp=tp, dp=dp).save(profile)
    if "--dry-run" not in argv:
        argv = [*argv, "--dry-run"]  # it would start SGLang, which needs a GPU
    capsys.readouterr()
    assert launch.main(argv) == 0, capsys.readouterr().err
    out = capsys.readouterr().out
    nodes = printed_nodes(out)
    assert len(nodes) == int(_flag(argv, "--nnodes", "1"))
    parser, ServerArgs = _server_args_parser()
    for env, node_argv in nodes:
        args = parser.parse_args(node_argv)
        assert ServerArgs.from_cli_args(args).model_path == values["MODEL"]
        assert args.speculative_algorithm == "DSPARK"
        if "--sla-tier" in argv:
            assert env["SGLANG_DSPARK_SLA_TIER"] == _flag(argv, "--sla-tier")
    if "--profile-capture" in argv:  # the capture command the next README line runs, for this phase
        phase = "compact" if profile is not None else "static"
        capture = next(line for line in out.splitlines() if "capture-http" in line)
        assert f"--phase {phase}" in capture and (env["SGLANG_RAGGED_VERIFY_MODE"] == phase)


def _check_capture_http(words: list[str]) -> None:
    from sglang_dspark.profile.cli import build_parser

    args = build_parser().parse_args(words[3:])  # it measures a live GPU server: parsed, not run
    assert args.func.__name__ == "_run_capture_http" and Path(args.model).is_dir() and Path(args.draft).is_dir()


def _check_router(words: list[str]) -> None:
    from sglang_router.launch_router import parse_router_args

    router_args = parse_router_args(words[3:])
    assert router_args.worker_urls == [w for w in words[words.index("--worker-urls") + 1:] if w.startswith("http")]


def test_every_command_of_the_sglang_section_runs(bound, capsys):
    variables, commands = section_commands()
    assert set(variables) == {"MODEL", "DRAFT", "SHARED"} and len(commands) >= 7
    checked = []
    for words in commands:
        words = _substitute(words, bound)
        if words[:2] == ["pip", "install"]:
            _check_pip_install(words)
        elif words[:3] == ["python", "-m", "sglang_dspark.sglang_plugin"]:
            _check_plugin(words)
        elif words[:3] == ["python", "-m", "sglang_dspark.launch"]:
            _check_launch(words, bound, capsys)
        elif words[:4] == ["python", "-m", "sglang_dspark.profile", "capture-http"]:
            _check_capture_http(words)
        elif words[:3] == ["python", "-m", "sglang_router.launch_router"]:
            _check_router(words)
        else:
            pytest.fail(f"README command with no check: {shlex.join(words)}")
        checked.append(words[2] if words[0] == "python" else words[0])
    assert checked.count("sglang_dspark.launch") >= 3
