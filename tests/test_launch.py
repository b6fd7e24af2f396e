"""The launcher's command line: dry runs, argument errors, and SGLang commands SGLang itself accepts."""

from __future__ import annotations

import argparse
import json
import shlex
import sys

import pytest

from sglang_dspark import launch
from test_profiles import make_model_dirs, make_profile
from sglang_dspark.launch_sglang import build_command


@pytest.fixture
def dirs(tmp_path):
    target, draft = make_model_dirs(tmp_path, gamma=3)
    # an SLA profile measured "on this machine" for the SGLang engine, with these directories
    make_profile(engine="sglang", target_dir=target, draft_dir=draft).save(tmp_path / "profile.yaml")
    return tmp_path


@pytest.fixture(scope="module")
def sglang_parser():
    from sglang.srt.server_args import ServerArgs

    parser = argparse.ArgumentParser(exit_on_error=False)
    ServerArgs.add_cli_args(parser)
    return parser


def _sglang_argv(printed: str) -> tuple[dict[str, str], list[str]]:
    words = shlex.split(printed)
    start = words.index("sglang.launch_server") + 1
    assert words[start - 3:start] == [sys.executable, "-m", "sglang.launch_server"]
    return dict(w.split("=", 1) for w in words[: start - 3]), words[start:]


@pytest.mark.sglang
def test_sglang_dry_run_parses_with_sglangs_own_parser(dirs, capsys, sglang_parser):
    rc = launch.main(["--model", str(dirs / "target"), "--draft", str(dirs / "draft"), "--engine", "sglang",
                      "--profile", str(dirs / "profile.yaml"), "--max-running", "8",
                      "--max-len", "2048", "--port", "31000", "--dry-run"])
    assert rc == 0
    env, argv = _sglang_argv(capsys.readouterr().out.strip())
    assert env == {"SGLANG_RAGGED_VERIFY_MODE": "compact"}
    args = sglang_parser.parse_args(argv)
    assert (args.model_path, args.speculative_algorithm, args.speculative_draft_model_path) == (
        str(dirs / "target"), "DSPARK", str(dirs / "draft"))
    # the profile's tables, exported for SGLang's own loaders
    exported = json.loads(open(args.speculative_dspark_sps_table_path).read())
    assert exported["sample_batch_tokens"] == [1, 4, 8, 16, 32]
    assert json.loads(open(args.speculative_dspark_confidence_sts_path).read())["temperatures"] == [1.0, 1.3, 0.7]
    assert (args.max_running_requests, args.context_length, args.port, args.host) == (8, 2048, 31000, "127.0.0.1")
    assert args.enable_metrics


@pytest.mark.sglang
@pytest.mark.parametrize("mode,verify", [("full", "static"), ("scheduled", "compact"), ("target", None)])
def test_sglang_modes(mode, verify, sglang_parser):
    argv, env = build_command("m", "d", mode, "127.0.0.1", 30000, seed=3, served_model_name="x")
    assert env.get("SGLANG_RAGGED_VERIFY_MODE") == verify
    args = sglang_parser.parse_args(argv[3:])
    assert args.speculative_algorithm == (None if mode == "target" else "DSPARK")
    assert (args.random_seed, args.served_model_name) == (3, "x")


@pytest.mark.sglang
def test_sglang_parser_rejects_a_misspelt_flag(sglang_parser):
    argv, _ = build_command("m", "d", "scheduled", "127.0.0.1", 30000)
    bad = [a.replace("--speculative-draft-model-path", "--speculative-draft-model-pth") for a in argv[3:]]
    with pytest.raises((argparse.ArgumentError, SystemExit)):
        sglang_parser.parse_args(bad)


def test_reference_dry_run(dirs, capsys):
    rc = launch.main(["--model", str(dirs / "target"), "--draft", str(dirs / "draft"), "--engine", "reference",
                      "--mode", "full", "--dry-run"])
    out = capsys.readouterr().out
    assert rc == 0 and "reference engine" in out and "mode=full" in out and str(dirs / "draft") in out


def test_zoo_name_resolves_to_the_cache_without_fetching_on_dry_run(tmp_path, capsys):
    rc = launch.main(["--model", "smollm2-135m-instruct", "--engine", "reference", "--mode", "target",
                      "--cache-dir", str(tmp_path), "--dry-run"])
    assert rc == 0 and str(tmp_path / "smollm2-135m-instruct") in capsys.readouterr().out
    assert not (tmp_path / "smollm2-135m-instruct").exists()


def test_auto_picks_reference_without_cuda(monkeypatch, caplog):
    import torch

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert launch.pick_engine("auto") == ("reference", "no CUDA device")
    assert launch.pick_engine("sglang")[0] == "sglang"


@pytest.mark.parametrize("extra,reason", [
    (["--model", "/nonexistent/model"], "no such directory"),
    (["--model", "{target}", "--draft", "/nonexistent/draft"], "--draft"),
    (["--model", "{target}"], "needs a drafter"),
    (["--model", "{target}", "--draft", "{draft}", "--profile", "/nonexistent.yaml"], "/nonexistent.yaml: cannot read"),
    (["--model", "{target}", "--draft", "{draft}", "--sla-tier", "interactive"], "--sla-tier needs --profile"),
    (["--model", "{target}", "--mode", "target", "--port", "0"], "--port"),
    (["--model", "{target}", "--mode", "target", "--max-len", "-5"], "--max-len"),
])
def test_bad_input_is_one_line_on_stderr(dirs, capsys, extra, reason):
    fill = {"target": dirs / "target", "draft": dirs / "draft"}
    rc = launch.main([a.format(**fill) for a in extra] + ["--engine", "reference", "--dry-run"])
    err = capsys.readouterr().err.strip()
    assert rc == 2 and reason in err and err.startswith("error: ") and "\n" not in err


def test_every_flag_has_help():
    actions = [a for a in launch.build_parser()._actions if a.option_strings and a.dest != "help"]
    assert {a.dest for a in actions} >= {"model", "draft", "profile", "force_profile", "sla_tier", "engine", "mode",
                                         "host", "port", "max_running", "max_len", "dry_run"}
    assert all(a.help for a in actions)


def test_argparse_rejects_unknown_choice(capsys):
    with pytest.raises(SystemExit) as exc:
        launch.main(["--model", "x", "--engine", "vllm"])
    assert exc.value.code != 0 and "invalid choice" in capsys.readouterr().err


def test_module_help_runs_without_loading_models():
    import subprocess

    out = subprocess.run([sys.executable, "-m", "sglang_dspark.launch", "--help"], capture_output=True, text=True,
                         timeout=120)
    assert out.returncode == 0 and "--dry-run" in out.stdout
