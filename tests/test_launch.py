"""The launcher's command line: dry runs, argument errors, and SGLang commands SGLang itself accepts."""

from __future__ import annotations

import json
import logging
import sys

import pytest

from sglang_dspark import launch
from test_profiles import make_model_dirs, make_profile


@pytest.fixture
def dirs(tmp_path):
    target, draft = make_model_dirs(tmp_path, gamma=3)
    # an SLA profile measured "on this machine" for the SGLang engine, with these directories
    make_profile(engine="sglang", target_dir=target, draft_dir=draft).save(tmp_path / "profile.yaml")
    return tmp_path


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


def test_a_zoo_model_not_converted_yet_finds_its_shipped_drafter_on_dry_run(tmp_path, capsys):
    from sglang_dspark import zoo

    shipped = zoo.shipped_drafter_for(tmp_path / "not-converted", "smollm2-135m-instruct")
    assert shipped is not None and shipped.endswith("smollm2-135m-instruct-dspark")
    rc = launch.main(["--model", "smollm2-135m-instruct", "--engine", "reference", "--cache-dir", str(tmp_path),
                      "--dry-run"])
    assert rc == 0 and f"draft={shipped}" in capsys.readouterr().out


def test_flags_of_the_other_engine_are_reported_not_ignored(dirs, caplog):
    with caplog.at_level(logging.WARNING):
        assert launch.main(["--model", str(dirs / "target"), "--mode", "target", "--engine", "reference", "--tp", "2",
                            "--dry-run"]) == 0
    assert any("--tp has no effect with --engine reference" in r.getMessage() for r in caplog.records)


def test_auto_picks_reference_without_cuda(monkeypatch, caplog):
    import torch

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert launch.pick_engine("auto") == ("reference", "no CUDA device")


def test_auto_picks_sglang_where_cuda_and_sglang_are_present(monkeypatch):
    import sglang  # noqa: F401  imported before CUDA is faked: its own import probes the driver
    import torch

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)  # the one call that detects CUDA
    assert launch.pick_engine("auto") == ("sglang", "CUDA device present and sglang importable")
    monkeypatch.setitem(sys.modules, "sglang", None)  # a broken install: the CPU path still starts
    engine, why = launch.pick_engine("auto")
    assert engine == "reference" and why.startswith("sglang is not importable (")


@pytest.mark.parametrize("extra,reason", [
    (["--model", "/nonexistent/model"], "no such directory"),
    (["--model", "{target}", "--draft", "/nonexistent/draft"], "--draft"),
    (["--model", "{target}"], "needs a drafter"),
    (["--model", "{target}", "--draft", "{draft}", "--profile", "/nonexistent.yaml"], "/nonexistent.yaml: cannot read"),
    (["--model", "{target}", "--draft", "{draft}", "--sla-tier", "interactive"], "--sla-tier needs --profile"),
    (["--model", "{target}", "--mode", "target", "--port", "0"], "--port"),
    (["--model", "{target}", "--mode", "target", "--max-len", "-5"], "--max-len"),
    (["--model", "{target}", "--mode", "target", "--drain-timeout", "-5"], "--drain-timeout -5.0: out of range"),
    (["--model", "{target}", "--mode", "target", "--tp", "0"], "--tp 0: out of range"),
    (["--model", "{target}", "--mode", "target", "--threads", "0"], "--threads 0: must be >= 1"),
    (["--model", "{target}", "--mode", "target", "--tool-call-parser", "hermess"],
     "--tool-call-parser 'hermess': not one of SGLang's ("),
    (["--model", "{target}", "--mode", "full", "--draft", "{draft}", "--sla-tier", "x"], "needs --mode scheduled"),
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

    # torch and transformers made unimportable, the zoo's fetch made to fail: --help needs none of them
    blocked = ("import runpy, sys\n"
               "sys.modules['torch'] = sys.modules['transformers'] = None\n"
               "from sglang_dspark import zoo\n"
               "zoo.resolve_model = lambda *a, **k: sys.exit('a model was resolved')\n"
               "sys.argv = ['launch', '--help']\n"
               "runpy.run_module('sglang_dspark.launch', run_name='__main__')\n")
    out = subprocess.run([sys.executable, "-c", blocked], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0 and "--dry-run" in out.stdout, out.stderr[-2000:]


def test_a_non_drafter_draft_is_one_line(dirs, capsys):
    rc = launch.main(["--model", str(dirs / "target"), "--draft", str(dirs / "target"), "--engine", "reference",
                      "--dry-run"])
    err = capsys.readouterr().err.strip()
    assert rc == 2 and "\n" not in err
    assert err == f"error: --draft {dirs / 'target'}: not a DSpark drafter directory (config.json has no " \
                  "target_layer_ids, mask_token_id; drafters are written by python -m sglang_dspark.train)"


def test_model_dir_finds_the_shipped_drafter_by_target_hash(dirs, tmp_path, monkeypatch, capsys, caplog):
    from sglang_dspark import zoo

    shipped = tmp_path / "shipped"
    for name, target_hash in (("other-dspark", "0" * 64), ("mine-dspark", zoo.dir_sha256(dirs / "target"))):
        (shipped / name).mkdir(parents=True)
        (shipped / name / zoo.TARGET_FILE).write_text(json.dumps({"target": name[:-7], "target_sha256": target_hash}))
    monkeypatch.setattr(zoo, "SHIPPED_DRAFTS", shipped)
    with caplog.at_level("INFO"):
        assert launch.main(["--model", str(dirs / "target"), "--engine", "reference", "--dry-run"]) == 0
    assert f"draft={shipped / 'mine-dspark'}" in capsys.readouterr().out
    assert any("shipped; trained for this target" in r.getMessage() for r in caplog.records)

    (shipped / "mine-dspark" / zoo.TARGET_FILE).unlink()  # no match left: say which drafters exist
    assert launch.main(["--model", str(dirs / "target"), "--engine", "reference", "--dry-run"]) == 2
    err = capsys.readouterr().err
    assert "no shipped drafter was trained for" in err and f"{shipped / 'other-dspark'} (for other)" in err


def test_served_name_and_context_default_to_the_model(dirs, capsys):
    (dirs / "target" / "config.json").write_text(json.dumps({"model_type": "llama", "max_position_embeddings": 4096}))
    assert launch.main(["--model", str(dirs / "target"), "--mode", "target", "--engine", "reference", "--dry-run"]) == 0
    out = capsys.readouterr().out
    assert "served as 'target'" in out and "context=4096 " in out
    assert launch.main(["--model", str(dirs / "target"), "--mode", "target", "--engine", "reference", "--dry-run",
                        "--max-len", "1024", "--served-model-name", "alias"]) == 0
    out = capsys.readouterr().out
    assert "served as 'alias'" in out and "context=1024 " in out


def test_help_shows_every_default():
    text = launch.build_parser().format_help().split("options:", 1)[1]
    for flag, default in (("--port", "30000)"), ("--host", "127.0.0.1)"), ("--mode", "scheduled)"),
                          ("--max-running", "16 on the reference engine;"), ("--engine", "auto)")):
        section = text.split(f"  {flag} ", 1)[1].split("\n  --", 1)[0]
        assert f"(default: {default}" in " ".join(section.split()), flag
