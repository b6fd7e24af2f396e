"""The command lines in deploy/ run what they say: every container command and preStop hook of every
rendered manifest, and every Exec line of the systemd units, parses with the argument parser of
the program it starts (the launcher's, the router's own, router_workers'), so a misspelt flag fails
here rather than in a crash loop; the units pass `systemd-analyze verify`; router_workers' own
errors."""

from __future__ import annotations

import argparse
import shutil
import subprocess
import sys

import pytest
from deploy_manifests import OVERLAYS, UNITS, containers, k8s_argv, shell_argv, systemd_argv, unit_environment, \
    unit_exec_lines
from loopback_server import dead_loopback_server
from sglang_router.launch_router import parse_router_args

from sglang_dspark import launch, router_workers

POD_ENV = {"POD_NAMESPACE": "dspark", "POD_IP": "10.0.0.7", "DSPARK_ROUTER": "http://dspark-router:30000"}
PYTHON_M = {"sglang_dspark.launch": launch.build_parser().parse_args,
            "sglang_router.launch_router": parse_router_args,
            "sglang_dspark.router_workers": router_workers.build_parser().parse_args}


def _option_strings(parser: argparse.ArgumentParser) -> set[str]:
    names = set(parser._option_string_actions)
    for action in parser._actions:  # sub-commands' flags (router_workers leave / join)
        if isinstance(action, argparse._SubParsersAction):
            for sub in action.choices.values():
                names |= _option_strings(sub)
    return names


def _router_parser() -> argparse.ArgumentParser:
    from sglang_router.router_args import RouterArgs

    parser = argparse.ArgumentParser()
    RouterArgs.add_cli_args(parser, use_router_prefix=False)  # what parse_router_args builds
    return parser


OPTION_STRINGS = {"sglang_dspark.launch": _option_strings(launch.build_parser()),
                  "sglang_router.launch_router": _option_strings(_router_parser()),
                  "sglang_dspark.router_workers": _option_strings(router_workers.build_parser())}


def parse(argv: list[str]):
    """argv (python -m MODULE ARGS) parsed by MODULE's own parser; SystemExit on a bad flag, and
    every flag spelt in full (argparse would take a prefix such as --max-runnin)."""
    assert argv[0].endswith("python") and argv[1] == "-m", argv
    flags = {w.split("=")[0] for w in argv[3:] if w.startswith("--")}
    assert flags <= OPTION_STRINGS[argv[2]], f"not a flag of {argv[2]}: {sorted(flags - OPTION_STRINGS[argv[2]])}"
    return argv[2], PYTHON_M[argv[2]](argv[3:])


def _pod_commands() -> list[tuple[str, list[str]]]:
    out = []
    for name in OVERLAYS:
        for doc, c in containers(name):
            env = {**POD_ENV, **{e["name"]: e.get("value", POD_ENV.get(e["name"])) for e in c.get("env", [])}}
            where = f"{name}: {doc['kind']}/{doc['metadata']['name']}"
            out.append((where, k8s_argv(c, env)))
            hook = c.get("lifecycle", {}).get("preStop", {}).get("exec", {}).get("command")
            if hook:
                out += [(f"{where} preStop", argv) for argv in shell_argv(hook, env) if argv[0] == "python"]
    return out


POD_COMMANDS = _pod_commands()


@pytest.mark.parametrize("where,argv", POD_COMMANDS, ids=[w for w, _ in POD_COMMANDS])
def test_manifest_commands_parse_with_their_programs_parsers(where, argv):
    module, args = parse(argv)
    if module == "sglang_dspark.router_workers":
        assert args.worker == f"http://{POD_ENV['POD_IP']}:30000" and args.router == POD_ENV["DSPARK_ROUTER"]


def test_every_program_and_hook_is_covered():
    modules = {argv[2] for _, argv in POD_COMMANDS}
    assert modules == set(PYTHON_M)
    assert sum("preStop" in w for w, _ in POD_COMMANDS) >= 4  # cpu, gpu, canary, the TP leader


def _unit_commands() -> list[tuple[str, str, list[str]]]:
    out = []
    for path in UNITS:
        env = unit_environment(path)
        for key, lines in unit_exec_lines(path).items():
            out += [(path.name, key, systemd_argv(line, env, "30001")) for line in lines]
    return out


UNIT_COMMANDS = _unit_commands()


@pytest.mark.parametrize("unit,key,argv", UNIT_COMMANDS, ids=[f"{u}-{k}" for u, k, _ in UNIT_COMMANDS])
def test_unit_commands_parse_with_their_programs_parsers(unit, key, argv):
    module, args = parse(argv)
    if module == "sglang_dspark.launch":
        assert args.port == 30001 and args.engine in unit
    if module == "sglang_dspark.router_workers":
        assert args.action == {"ExecStartPost": "join", "ExecStop": "leave"}[key]
        assert args.worker == "http://127.0.0.1:30001"


def test_replica_units_join_after_start_and_leave_before_sigterm():
    replicas = [p for p in UNITS if p.name.endswith("@.service")]
    assert len(replicas) == 2
    for path in replicas:
        lines = unit_exec_lines(path)
        assert "router_workers join" in lines["ExecStartPost"][0] and "router_workers leave" in lines["ExecStop"][0]
        text = path.read_text()
        assert "KillMode=mixed" in text and "KillSignal=SIGTERM" in text, path.name


@pytest.mark.skipif(shutil.which("systemd-analyze") is None, reason="systemd-analyze is not installed here")
def test_units_pass_systemd_analyze_verify(tmp_path):
    names = []
    for path in UNITS:
        name = path.name.replace("@.service", "@30001.service")
        # the install path is not this machine's: point it at this interpreter, nothing else changes
        (tmp_path / name).write_text(path.read_text().replace("/opt/sglang-dspark/.venv/bin/python", sys.executable))
        names.append(str(tmp_path / name))
    done = subprocess.run(["systemd-analyze", "verify", "--man=no", *names], capture_output=True, text=True,
                          timeout=60, cwd=tmp_path)
    assert done.returncode == 0 and not done.stderr.strip(), done.stderr


def test_router_workers_reports_an_unreachable_router_in_one_line(capsys):
    with dead_loopback_server() as url:
        rc = router_workers.main(["leave", "--router", url, "--worker", "http://127.0.0.1:1", "--timeout", "1"])
    err = capsys.readouterr().err
    assert rc == 1 and err.count("\n") == 1 and err.startswith("error: leave http://127.0.0.1:1:"), err


def test_router_workers_bad_input_exits_2(capsys):
    assert router_workers.main(["join", "--router", "http://r", "--worker", "http://w", "--timeout", "0"]) == 2
    with pytest.raises(SystemExit) as exc:
        router_workers.main(["join", "--router", "http://r"])
    assert exc.value.code == 2
    assert capsys.readouterr().err.count("\n") == 2


SGLANG_COMMANDS = [(w, argv) for w, argv in POD_COMMANDS + [(f"{u} {k}", a) for u, k, a in UNIT_COMMANDS]
                   if argv[2] == "sglang_dspark.launch" and argv[argv.index("--engine") + 1] == "sglang"]


@pytest.mark.sglang
@pytest.mark.parametrize("where,argv", SGLANG_COMMANDS, ids=[w for w, _ in SGLANG_COMMANDS])
def test_sglang_replicas_launch_what_sglangs_own_parser_accepts(where, argv, tmp_path, monkeypatch, capsys):
    """The launcher's dry run of the manifest's args (model and drafter: stand-in directories at the
    mount paths) prints SGLang commands that SGLang's ServerArgs parse, the node's rank among them."""
    from sglang.srt.server_args import ServerArgs
    from test_launch_sglang import printed_nodes
    from test_profiles import make_model_dirs

    target, draft = make_model_dirs(tmp_path, gamma=3)
    paths = {"/models/target": str(target), "/models/draft": str(draft), "/srv/dspark/models/target": str(target),
             "/srv/dspark/models/draft": str(draft)}
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.delenv("SGLANG_PLUGINS", raising=False)
    args = [paths.get(w, w) for w in argv[3:]]
    assert launch.main([*args, "--dry-run"]) == 0, capsys.readouterr().err
    nodes = printed_nodes(capsys.readouterr().out)
    mine = launch.build_parser().parse_args(args)
    assert len(nodes) == mine.nnodes
    parser = argparse.ArgumentParser(exit_on_error=False)
    ServerArgs.add_cli_args(parser)
    parsed = [parser.parse_args(node_argv) for _, node_argv in nodes]
    assert [p.node_rank for p in parsed] == list(range(mine.nnodes))
    for env, p in zip((e for e, _ in nodes), parsed):
        assert ServerArgs.from_cli_args(p).model_path == str(target) and p.speculative_algorithm == "DSPARK"
        assert p.tp_size == mine.tp and p.port == mine.port and p.host == mine.host
        assert env["SGLANG_RAGGED_VERIFY_MODE"] == {"full": "static", "scheduled": "compact"}[mine.mode]
