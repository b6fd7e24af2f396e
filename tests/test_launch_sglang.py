"""`launch --engine sglang`: every printed command parses with SGLang's own ServerArgs, over a matrix
of modes, profiles, tiers and tp / dp / nodes; the environment configures the plugin; exported
tables land in a named or cached directory, never a temporary one."""

from __future__ import annotations

import argparse
import itertools
import json
import os
import shlex
import sys

import pytest
from test_profiles import make_model_dirs, make_profile

from sglang_dspark import launch

pytestmark = pytest.mark.sglang


@pytest.fixture(scope="module")
def server_args():
    from sglang.srt.server_args import ServerArgs

    parser = argparse.ArgumentParser(exit_on_error=False)
    ServerArgs.add_cli_args(parser)
    return parser, ServerArgs


@pytest.fixture
def dirs(tmp_path, monkeypatch):
    target, draft = make_model_dirs(tmp_path, gamma=3)
    make_profile(engine="sglang", target_dir=target, draft_dir=draft).save(tmp_path / "profile.yaml")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))  # the export cache lives under ~/.cache
    monkeypatch.delenv("SGLANG_PLUGINS", raising=False)
    return tmp_path


def printed_nodes(text: str) -> list[tuple[dict[str, str], list[str]]]:
    """(environment, argv after `-m sglang.launch_server`) of every node the dry run printed."""
    nodes, env = [], {}
    for line in text.strip().splitlines():
        if line.startswith("export "):
            key, _, value = line.removeprefix("export ").partition("=")
            env[key] = shlex.split(value)[0]
        elif "sglang.launch_server" in line:
            words = shlex.split(line)
            start = words.index("sglang.launch_server") + 1
            assert words[: start] == [sys.executable, "-m", "sglang.launch_server"]
            nodes.append((env, words[start:]))
            env = {}
    return nodes


def _dry_run(dirs, capsys, *extra) -> list[tuple[dict[str, str], list[str]]]:
    rc = launch.main(["--model", str(dirs / "target"), "--draft", str(dirs / "draft"), "--engine", "sglang",
                      "--dry-run", *extra])
    out = capsys.readouterr()
    assert rc == 0, out.err
    return printed_nodes(out.out)


MATRIX = list(itertools.product(
    ("target", "full", "scheduled"),
    ((), ("--sla-tier", "interactive"), ("--sps-learning", "off")),
    ((), ("--tp", "2"), ("--dp", "2"), ("--tp", "2", "--nnodes", "2", "--dist-init-addr", "10.0.0.1:5000")),
))


@pytest.mark.parametrize("mode,tier,parallel", MATRIX)
def test_every_printed_command_parses_with_sglangs_server_args(dirs, capsys, server_args, mode, tier, parallel):
    parser, ServerArgs = server_args
    tp, dp = (int(parallel[parallel.index(f) + 1]) if f in parallel else 1 for f in ("--tp", "--dp"))
    profile = dirs / f"profile-tp{tp}-dp{dp}.yaml"  # a profile is captured per deployment shape
    make_profile(engine="sglang", target_dir=dirs / "target", draft_dir=dirs / "draft", tp=tp, dp=dp).save(profile)
    shared = ("--export-dir", str(dirs / "shared")) if "--nnodes" in parallel else ()  # every node reads the tables
    nodes = _dry_run(dirs, capsys, "--mode", mode, "--profile", str(profile), "--max-running", "8", *tier, *parallel,
                     *shared)
    nnodes = int(parallel[parallel.index("--nnodes") + 1]) if "--nnodes" in parallel else 1
    assert len(nodes) == nnodes
    for rank, (env, argv) in enumerate(nodes):
        args = parser.parse_args(argv)  # an unknown or misspelt flag raises here
        assert ServerArgs.from_cli_args(args).model_path == str(dirs / "target")
        assert args.enable_metrics and (args.node_rank, args.nnodes) == (rank, nnodes)
        assert args.speculative_algorithm == (None if mode == "target" else "DSPARK")
        assert env.get("SGLANG_RAGGED_VERIFY_MODE") == {"target": None, "full": "static", "scheduled": "compact"}[mode]
        assert (args.tp_size, args.dp_size) == (tp, dp)
        if mode == "scheduled":
            assert env["SGLANG_DSPARK_PROFILE"] == str(profile.resolve())
            assert ("SGLANG_DSPARK_SLA_TIER" in env) == bool(tier and tier[0] == "--sla-tier")
            # the tier's cap (4), shared by the data-parallel replicas
            assert args.max_running_requests == (4 // dp if tier and tier[0] == "--sla-tier" else 8)
            exported = json.loads(open(args.speculative_dspark_sps_table_path).read())
            assert exported["sample_batch_tokens"] == [1, 4, 8, 16, 32]
            assert args.speculative_dspark_sps_table_path.startswith(str(dirs / ("shared" if shared else "home/.cache")))
            assert args.speculative_dspark_block_size == 3
        else:
            assert not any(k.startswith("SGLANG_DSPARK_") for k in env)


def test_a_profile_of_another_deployment_shape_is_refused(dirs, capsys):
    rc = launch.main(["--model", str(dirs / "target"), "--draft", str(dirs / "draft"), "--engine", "sglang",
                      "--dry-run", "--profile", str(dirs / "profile.yaml"), "--tp", "2"])
    err = capsys.readouterr().err.strip()
    assert rc == 2 and "tp: profile 1, actual 2" in err and "\n" not in err


def test_the_tool_call_parser_reaches_sglang(dirs, capsys, server_args):
    parser, _ = server_args
    (env, argv), = _dry_run(dirs, capsys, "--mode", "full", "--tool-call-parser", "hermes")
    assert parser.parse_args(argv).tool_call_parser == "hermes"


def test_a_misspelt_flag_fails_the_parse(dirs, capsys, server_args):
    parser, _ = server_args
    (env, argv), = _dry_run(dirs, capsys, "--mode", "full")
    with pytest.raises((argparse.ArgumentError, SystemExit)):
        parser.parse_args([a.replace("--speculative-draft-model-path", "--speculative-draft-model-pth") for a in argv])


def test_profile_capture_phase_1_is_static_and_prints_both_phases(dirs, capsys, server_args):
    parser, _ = server_args
    rc = launch.main(["--model", str(dirs / "target"), "--draft", str(dirs / "draft"), "--engine", "sglang",
                      "--dry-run", "--profile-capture", "--port", "31000", "--admin-api-key", "sk-admin"])
    out = capsys.readouterr().out
    assert rc == 0
    (env, argv), = printed_nodes(out)
    assert env == {"SGLANG_RAGGED_VERIFY_MODE": "static", "SGLANG_DSPARK_ENABLE_SPS_RECORD": "1"}
    assert parser.parse_args(argv).speculative_dspark_sps_table_path is None
    capture = next(line for line in out.splitlines() if "capture-http" in line)
    assert "--base-url http://127.0.0.1:31000" in capture and "--api-key '***'" in capture
    from sglang_dspark.profile.cli import build_parser

    phase1 = build_parser().parse_args(shlex.split(capture)[3:])  # the printed command is one our CLI accepts
    assert phase1.phase == "static"
    relaunch = next(line for line in out.splitlines() if "sglang_dspark.launch " in line)
    again = launch.build_parser().parse_args(shlex.split(relaunch)[3:])
    assert again.profile_capture and again.profile == str(phase1.out) and again.port == 31000


def test_profile_capture_phase_2_runs_compact_on_the_phase_1_table(dirs, capsys, server_args):
    parser, _ = server_args
    rc = launch.main(["--model", str(dirs / "target"), "--draft", str(dirs / "draft"), "--engine", "sglang",
                      "--dry-run", "--profile-capture", "--profile", str(dirs / "profile.yaml"), "--max-running", "8",
                      "--sla-tier", "interactive"])
    out = capsys.readouterr().out
    assert rc == 0
    (env, argv), = printed_nodes(out)
    assert env == {"SGLANG_RAGGED_VERIFY_MODE": "compact", "SGLANG_DSPARK_ENABLE_SPS_RECORD": "1"}  # no SLA planner
    args = parser.parse_args(argv)
    assert json.loads(open(args.speculative_dspark_sps_table_path).read())["sample_batch_tokens"] == [1, 4, 8, 16, 32]
    assert args.max_running_requests == 8  # not the tier's cap: capture measures up to what the server admits
    capture = next(line for line in out.splitlines() if "capture-http" in line)
    from sglang_dspark.profile.cli import build_parser

    phase2 = build_parser().parse_args(shlex.split(capture)[3:])
    assert phase2.phase == "compact" and sorted(phase2.tier) == ["batch:5:30:16", "interactive:20:2:4"]


def test_scheduled_without_a_profile_is_refused(dirs, capsys):
    rc = launch.main(["--model", str(dirs / "target"), "--draft", str(dirs / "draft"), "--engine", "sglang",
                      "--dry-run"])
    err = capsys.readouterr().err.strip()
    assert rc == 2 and "needs a profile for this deployment" in err and "\n" not in err


def test_a_profile_of_another_machine_is_refused_on_sglang(dirs, capsys, tmp_path):
    foreign = tmp_path / "foreign.yaml"
    make_profile(engine="sglang").save(foreign)  # hashes and hardware of somewhere else
    rc = launch.main(["--model", str(dirs / "target"), "--draft", str(dirs / "draft"), "--engine", "sglang",
                      "--dry-run", "--profile", str(foreign)])
    err = capsys.readouterr().err
    assert rc == 2 and "fingerprint does not match" in err and "hardware" in err


def test_an_allow_list_keeps_sglangs_own_plugins(dirs, capsys, monkeypatch):
    monkeypatch.setenv("SGLANG_PLUGINS", "my-plugin")
    (env, _), = _dry_run(dirs, capsys, "--mode", "full")
    assert env["SGLANG_PLUGINS"] == "my-plugin,sglang_dspark,smg-servicer,smg-zmq"


def test_keys_reach_sglang_but_not_the_dry_runs_output(dirs, capsys, server_args, monkeypatch):
    parser, _ = server_args
    flags = ["--profile", str(dirs / "profile.yaml"), "--api-key", "sk-user", "--admin-api-key", "sk-admin",
             "--export-dir", str(dirs / "exported")]
    (_, argv), = _dry_run(dirs, capsys, *flags)
    args = parser.parse_args(argv)
    assert (args.api_key, args.admin_api_key, args.served_model_name) == ("***", "***", "target")
    assert args.speculative_dspark_sps_table_path == str(dirs / "exported" / "sps_table.json")
    from sglang_dspark import launch_sglang

    executed = []
    monkeypatch.setattr(launch_sglang, "exec_command", executed.append)
    assert launch.main(["--model", str(dirs / "target"), "--draft", str(dirs / "draft"), "--engine", "sglang",
                        *flags]) == 0
    args = parser.parse_args(executed[0].argv[3:])
    assert (args.api_key, args.admin_api_key) == ("sk-user", "sk-admin")


def test_multi_node_scheduled_needs_a_shared_export_dir(dirs, capsys):
    profile = dirs / "tp2.yaml"
    make_profile(engine="sglang", target_dir=dirs / "target", draft_dir=dirs / "draft", tp=2).save(profile)
    rc = launch.main(["--model", str(dirs / "target"), "--draft", str(dirs / "draft"), "--engine", "sglang",
                      "--dry-run", "--profile", str(profile), "--tp", "2", "--nnodes", "2",
                      "--dist-init-addr", "10.0.0.1:5000"])
    err = capsys.readouterr().err
    assert rc == 2 and "--export-dir" in err and "all nodes share" in err


def test_multi_node_needs_a_rendezvous(dirs, capsys):
    rc = launch.main(["--model", str(dirs / "target"), "--draft", str(dirs / "draft"), "--engine", "sglang",
                      "--dry-run", "--mode", "full", "--nnodes", "2"])
    assert rc == 2 and "--dist-init-addr" in capsys.readouterr().err


def test_a_tier_beyond_the_measured_batch_sizes_is_refused_unless_forced(dirs, capsys):
    # the profile measured steps of at most 4 requests; the "batch" tier admits 16
    base = ["--model", str(dirs / "target"), "--draft", str(dirs / "draft"), "--engine", "sglang", "--dry-run",
            "--profile", str(dirs / "profile.yaml")]
    assert launch.main([*base, "--sla-tier", "batch"]) == 2
    err = capsys.readouterr().err.strip()
    assert "tier 'batch' admits 16 requests but the profile measured at most 4 per step" in err and "\n" not in err
    assert launch.main([*base, "--sla-tier", "interactive"]) == 0  # 4: inside what was measured
    assert launch.main([*base, "--sla-tier", "batch", "--force-profile"]) == 0


def test_with_a_tier_the_captured_graph_sizes_reach_the_plugin(dirs, capsys, server_args):
    parser, _ = server_args
    (env, argv), = _dry_run(dirs, capsys, "--profile", str(dirs / "profile.yaml"), "--sla-tier", "interactive")
    args = parser.parse_args(argv)
    assert args.cuda_graph_bs_decode[-1] == args.max_running_requests == 4  # every batch the tier admits has a graph
    gamma = args.speculative_dspark_block_size
    assert env["SGLANG_DSPARK_GRAPH_TOKENS"] == ",".join(str(bs * (gamma + 1)) for bs in args.cuda_graph_bs_decode)
    from sglang_dspark.sglang_plugin.settings import GRAPH_TOKENS_ENV

    assert GRAPH_TOKENS_ENV == "SGLANG_DSPARK_GRAPH_TOKENS"  # the name the plugin reads


def test_with_learning_the_learned_table_is_written_beside_the_exported_profile(dirs, capsys, server_args):
    parser, _ = server_args
    (env, argv), = _dry_run(dirs, capsys, "--profile", str(dirs / "profile.yaml"), "--export-dir", str(dirs / "out"))
    from sglang_dspark.sglang_plugin.settings import EXPORT_DIR_ENV

    assert env[EXPORT_DIR_ENV] == str(dirs / "out")  # where `profile snapshot --from-dir` reads it
    assert os.path.dirname(parser.parse_args(argv).speculative_dspark_sps_table_path) == str(dirs / "out")
    (env, _), = _dry_run(dirs, capsys, "--profile", str(dirs / "profile.yaml"), "--sps-learning", "off")
    assert EXPORT_DIR_ENV not in env


@pytest.mark.parametrize("mode,tp", [("scheduled", 2), ("scheduled", 1), ("full", 2), ("target", 2)])
def test_compact_verify_on_several_gpus_runs_without_the_overlap_scheduler(dirs, capsys, server_args, mode, tp):
    """sglang#31023: compact verify + CUDA graphs + overlap crashes at graph-size changes at TP 4 / 8 and
    ran clean with overlap off; the launcher keeps a scheduled multi-GPU deployment off it, and says so."""
    parser, _ = server_args
    profile = dirs / f"profile-tp{tp}.yaml"
    make_profile(engine="sglang", target_dir=dirs / "target", draft_dir=dirs / "draft", tp=tp).save(profile)
    rc = launch.main(["--model", str(dirs / "target"), "--draft", str(dirs / "draft"), "--engine", "sglang",
                      "--dry-run", "--mode", mode, "--profile", str(profile), "--tp", str(tp)])
    out = capsys.readouterr()
    assert rc == 0, out.err
    [(_, argv)] = printed_nodes(out.out)
    guarded = mode == "scheduled" and tp > 1
    assert parser.parse_args(argv).disable_overlap_schedule is guarded
    notes = [line for line in out.err.splitlines() if line.startswith("note: ")]
    assert len(notes) == guarded and (not guarded or "sglang#31023" in notes[0])


def test_a_one_probe_table_is_refused_for_scheduled_serving_as_sglang_would_ignore_it(dirs, capsys):
    from sglang.srt.speculative.dspark_components.dspark_sps import (is_uninitialized_sps_table,
                                                                     load_sps_table_from_path)

    from sglang_dspark.profile.schema import SpsCostTable

    full = make_profile(engine="sglang", target_dir=dirs / "target", draft_dir=dirs / "draft")
    one = full.replaced(sps=full.sps.model_copy(update={"cost": SpsCostTable(
        sample_batch_tokens=[4], sample_steps_per_sec=[90.0], max_batch_tokens=64)}))
    one.save(dirs / "one.yaml")
    for profile, refused in ((dirs / "one.yaml", True), (dirs / "profile.yaml", False)):
        sps, _ = one.load(profile).export_sglang(dirs / f"export-{profile.stem}")
        assert is_uninitialized_sps_table(load_sps_table_from_path(str(sps))) is refused  # SGLang's own reading
        rc = launch.main(["--model", str(dirs / "target"), "--draft", str(dirs / "draft"), "--engine", "sglang",
                          "--dry-run", "--mode", "scheduled", "--profile", str(profile)])
        err = capsys.readouterr().err.strip()
        assert (rc == 2) is refused and (not refused or ("one probe" in err and "\n" not in err))


def _scheduled_tp2(dirs, capsys) -> tuple[dict[str, str], list[str]]:
    profile = dirs / "profile-tp2.yaml"
    make_profile(engine="sglang", target_dir=dirs / "target", draft_dir=dirs / "draft", tp=2).save(profile)
    (env, argv), = _dry_run(dirs, capsys, "--mode", "scheduled", "--profile", str(profile), "--tp", "2")
    return env, argv


@pytest.mark.parametrize("extra,why", [
    (["--disaggregation-mode", "decode"], "PD disaggregation"),
    (["--attn-dp-size", "2"], "DP attention"),
    (["--attention-data-parallel-size", "2"], "DP attention"),
])
def test_pd_disaggregation_and_dp_attention_with_dspark_are_refused(dirs, capsys, server_args, extra, why):
    """No launcher flag emits them today; the check reads the command as written, so a DSpark command
    that carries one (SGLang's own spelling: its parser takes it) is refused, in one line."""
    from sglang_dspark.launch_sglang import known_crash

    parser, _ = server_args
    env, argv = _scheduled_tp2(dirs, capsys)
    assert known_crash(argv, env) is None
    parser.parse_args(argv + extra)
    reason = known_crash(argv + extra, env)
    assert reason is not None and why in reason and "\n" not in reason
    assert known_crash([a for a in argv if a != "DSPARK"] + extra, env) is None  # plain SGLang: not ours to refuse


def test_compact_verify_on_several_gpus_with_overlap_on_is_refused(dirs, capsys):
    """sglang#31023: the guard adds --disable-overlap-schedule; a compact multi-GPU command without it
    is refused, so the guard cannot be dropped silently."""
    from sglang_dspark.launch_sglang import known_crash

    env, argv = _scheduled_tp2(dirs, capsys)
    bare = [a for a in argv if a != "--disable-overlap-schedule"]
    assert "--disable-overlap-schedule" in argv and known_crash(argv, env) is None
    assert "sglang#31023" in known_crash(bare, env)
    assert known_crash(bare, {**env, "SGLANG_RAGGED_VERIFY_MODE": "static"}) is None  # static verify: no report


@pytest.mark.parametrize("config,native", [
    ({"block_size": 3, "dspark_block_size": 5}, 5),
    ({"block_size": 3, "dflash_config": {"block_size": 4}}, 4),
    ({"block_size": 3}, 3),
])
def test_a_drafter_sglang_runs_at_another_block_size_is_refused_in_compact_mode(dirs, capsys, config, native):
    """sglang#34023: compact verify runs the drafter at its checkpoint's own block size, which SGLang reads
    from dspark_block_size / dflash_config first, and ignores --speculative-dspark-block-size; the
    launcher passes config.json's top-level block_size. Where the two differ compact mode is refused."""
    from sglang.srt.speculative.dspark_components.dspark_config import parse_dspark_draft_config

    from sglang_dspark.launch_sglang import native_block_size

    draft = dirs / "draft-native"
    draft.mkdir()
    (draft / "config.json").write_text(json.dumps({**config, "architectures": ["DSparkDraftModel"],
                                                   "target_layer_ids": [0, 1], "mask_token_id": 0}))
    (draft / "model.safetensors").write_bytes(b"draft-weights")
    assert parse_dspark_draft_config(draft_hf_config=json.loads((draft / "config.json").read_text())).gamma == native
    assert native_block_size(draft) == native  # the launcher's reading is SGLang's
    profile = dirs / "native.yaml"
    make_profile(engine="sglang", target_dir=dirs / "target", draft_dir=draft).save(profile)
    base = ["--model", str(dirs / "target"), "--draft", str(draft), "--engine", "sglang", "--dry-run",
            "--profile", str(profile)]
    refused = native != 3
    for mode, compact in (("scheduled", True), ("full", False)):
        rc = launch.main([*base, "--mode", mode])
        err = capsys.readouterr().err.strip()
        assert (rc == 2) is (refused and compact), err
        assert rc == 0 or ("sglang#34023" in err and f"block size {native}" in err and "\n" not in err)
    rc = launch.main([*base, "--profile-capture"])  # phase 2 of the capture is compact verify too
    assert (rc == 2) is refused and (not refused or "sglang#34023" in capsys.readouterr().err)
