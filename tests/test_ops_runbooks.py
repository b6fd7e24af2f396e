"""ops/runbooks: they render as Markdown, alerts.md has a section per alert, and every command in a
```bash block is exercised. RULES says how each command is exercised (first matching prefix):

  run      as written, in a sandbox holding what it reads and writes (SANDBOX_LINKS, SANDBOX_COPIES,
           and write_fixtures: what earlier steps that cannot run here would have written);
           `python ...` commands run in this process, so torch is imported once
  dry-run  with --dry-run appended (it would start a server, on a GPU for --engine sglang)
  help     its --help, and every --flag the command uses must be in it (needs a GPU, a server, or
           minutes), with the reason
  promql   the query it sends to Prometheus parses and names only exported or recorded metrics
           (there is no Prometheus server here)
  live     it talks to a running replica: bash parses it and the path is one the server serves

A command no rule covers fails the test. The slow test then runs the commands that a CPU can run
for real against a live reference server, with tiny inputs (`tiny` arguments, appended: argparse
keeps the last value), in runbook order.
"""

from __future__ import annotations

import contextlib
import functools
import io
import json
import os
import re
import runpy
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest
import yaml
from markdown_it import MarkdownIt

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # `ops` is a folder of the repository, not installed

from ops.grafana.check_dashboard import without_variables  # noqa: E402
from ops.known_metrics import known_names  # noqa: E402
from ops.promql import metric_names, parse_errors  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
RUNBOOKS = ROOT / "ops" / "runbooks"
ALERT_RULES = ROOT / "ops" / "prometheus" / "rules" / "dspark-alerts.yml"
SHIPPED_PROFILE = "sla_profiles/smollm2-135m-instruct-cpu.yaml"
SHIPPED_STS = "benchmarks/results/sts_smollm2-135m-instruct-dspark.json"
DRAFT = "launch/models/smollm2-135m-instruct-dspark"


@dataclass(frozen=True)
class Rule:
    prefix: str
    how: str  # run | dry-run | help | promql | live
    why: str = ""  # why not run as written
    help: str = ""  # the --help command, for how == "help"
    tiny: str | None = None  # slow test: run for real with these arguments appended ("" = as written)


RULES = [
    Rule("python -m sglang_dspark.launch ", "dry-run", "starts a server (SGLang on a GPU)"),
    Rule("python -m sglang_router.launch_router ", "help", "needs running replicas; tests/test_router_scale_out.py "
         "runs the router in front of two", "python -m sglang_router.launch_router --help"),
    Rule("python -m sglang_dspark.loadtest run ", "help", "minutes of load against a server",
         "python -m sglang_dspark.loadtest run --help", tiny="--users 1 --duration 3s --max-tokens 8 --host $HOST"),
    Rule("python -m sglang_dspark.loadtest report ", "help", "reads the runs of the load tests above",
         "python -m sglang_dspark.loadtest report --help", tiny=""),
    Rule("python -m sglang_dspark.profile capture-http ", "help", "needs SGLang on a GPU started with "
         "--profile-capture; tests/test_http_capture.py runs it against the reference server",
         "python -m sglang_dspark.profile capture-http --help"),
    Rule("python -m sglang_dspark.profile capture ", "help", "minutes of forced-budget steps of SmolLM2",
         "python -m sglang_dspark.profile capture --help",
         tiny="--requests 1 --points 2 --rounds 1 --repeats 1 --warmup 0 --prompt-tokens 8"),
    Rule("python -m sglang_dspark.profile snapshot --from-dir ", "help", "reads what an SGLang replica learning its "
         "table wrote; tests/test_sglang_plugin.py runs it", "python -m sglang_dspark.profile snapshot --help"),
    Rule("python -m sglang_dspark.profile snapshot ", "help", "needs a live reference server that learned its table",
         "python -m sglang_dspark.profile snapshot --help", tiny=""),
    Rule("python -m sglang_dspark.profile ", "run"),  # validate, export, set-sts: seconds
    Rule("python -m sglang_dspark.zoo fetch ", "help", "converts the model on first use (the slow test runs it)",
         "python -m sglang_dspark.zoo fetch --help", tiny=""),
    Rule("python -m sglang_dspark.evaluate ", "help", "decodes the benchmark and calibration splits for minutes",
         "python -m sglang_dspark.evaluate --help", tiny="--limit 1 --max-new-tokens 8 --temperatures 1 --threads 1"),
    Rule("python -m sglang_dspark.canary_probe ", "help", "needs a DSpark fleet and a target-only replica",
         "python -m sglang_dspark.canary_probe --help"),
    Rule("python -m sglang_dspark.sglang_plugin", "help", "checks the SGLang of the replica's interpreter, on its "
         "host; tests/test_sglang_plugin.py runs it", "python -m sglang_dspark.sglang_plugin --help"),
    Rule("python ops/capacity.py ", "run"),
    Rule("python ops/grafana/check_dashboard.py", "run"),
    Rule("promtool check config ", "run"),
    Rule("mkdir -p evidence && cp -r ", "run"),
    Rule('curl -s "$PROM/api/v1/query" ', "promql", "needs a Prometheus server scraping a fleet"),
    Rule("curl -s http://127.0.0.1:9090/api/v1/query ", "promql", "needs a Prometheus server scraping a fleet"),
    Rule('curl -s "$HOST/metrics" | grep -E \'^sglang_dspark_plugin_active', "live",
         "an SGLang replica's gauge: the reference server runs no plugin, so the grep finds nothing there"),
    Rule('curl -s "$HOST/', "live", "needs a running replica", tiny=""),
]

# Files the sandbox links to (read-only use) or copies (commands write next to them)
SANDBOX_LINKS = ("launch", "ops", "loadtests", "benchmarks")
SANDBOX_COPIES = ("sla_profiles",)


@dataclass(frozen=True)
class Command:
    runbook: str
    text: str
    settings: tuple[str, ...]  # the runbook's NAME=value lines before it

    @property
    def rule(self) -> Rule | None:
        return next((r for r in RULES if self.text.startswith(r.prefix)), None)

    def __str__(self) -> str:
        return f"{self.runbook}: {self.text}"


def bash_blocks(text: str) -> list[str]:
    return [t.content for t in MarkdownIt("commonmark").parse(text) if t.type == "fence" and t.info.strip() == "bash"]


def runbook_commands(path: Path) -> list[Command]:
    commands, settings = [], []
    for block in bash_blocks(path.read_text()):
        for line in block.replace("\\\n", " ").splitlines():
            line = line.strip()
            if not line or line.startswith("#"):
                continue
            if re.fullmatch(r"[A-Z_][A-Z0-9_]*=\S*", line):
                settings.append(line)
                continue
            commands.append(Command(path.name, line, tuple(settings)))
    return commands


def all_commands() -> list[Command]:
    return [c for path in sorted(RUNBOOKS.glob("*.md")) for c in runbook_commands(path)]


def flags(text: str) -> set[str]:
    return {word.split("=")[0] for word in shlex.split(text, comments=True) if word.startswith("--")}


def flag_in_help(flag: str, usage: str) -> bool:
    """`flag` appears in `usage` as itself, not as the start of a longer flag (`--gate` in `--gate-share`)."""
    return re.search(rf"{re.escape(flag)}(?![\w-])", usage) is not None


@functools.lru_cache(maxsize=None)
def help_text(command: str) -> str:
    done = subprocess.run(["bash", "-c", command], capture_output=True, text=True, timeout=120, cwd=ROOT,
                          env=environment())
    assert done.returncode == 0, f"{command}: {done.stdout}{done.stderr}"
    return done.stdout


def environment(extra: dict | None = None) -> dict:
    env = dict(os.environ)
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"  # `python` is this venv's
    return {**env, **(extra or {})}


def write_fixtures(sandbox: Path, model_dir: str) -> None:
    """What the runbooks' earlier steps write where those steps cannot run here (a GPU, minutes)."""
    from sglang_dspark.profile.fingerprint import fingerprint_for
    from sglang_dspark.profile.schema import SlaProfile

    shipped = SlaProfile.load(ROOT / SHIPPED_PROFILE)
    for engine, names in (("sglang", ("smollm2-135m-instruct-sglang", "new-sglang", "new-sglang-static")),  # capture-http's
                          ("reference", ("new-cpu", "learned-cpu"))):  # capture's and snapshot's output
        fp = fingerprint_for(engine=engine, target_dir=model_dir, draft_dir=ROOT / DRAFT, gamma=shipped.fingerprint.gamma)
        for name in names:
            shipped.replaced(fingerprint=fp, name=name).save(sandbox / "sla_profiles" / f"{name}.yaml")
    (sandbox / "runs" / "sts").mkdir(parents=True)
    shutil.copy(ROOT / SHIPPED_STS, sandbox / "runs" / "sts" / "sts.json")  # evaluate --sts-out's output
    (sandbox / "runs" / "canary").mkdir(parents=True)
    (sandbox / "runs" / "canary" / "canary_mismatches.jsonl").write_text(json.dumps(
        {"request_id": "r1", "first_difference": 3, "prompt_ids": [1, 2], "speculative": [5, 6, 7, 8],
         "replayed": [5, 6, 7, 9]}) + "\n")  # a canary's evidence


@pytest.fixture(scope="module")
def sandbox(tmp_path_factory, smollm2_dir) -> Path:
    root = tmp_path_factory.mktemp("runbooks")
    for name in SANDBOX_LINKS:
        (root / name).symlink_to(ROOT / name)
    for name in SANDBOX_COPIES:
        shutil.copytree(ROOT / name, root / name)
    write_fixtures(root, smollm2_dir)
    return root


def run_in(sandbox: Path, command: Command, text: str | None = None, overrides: dict | None = None,
           timeout: int = 300) -> subprocess.CompletedProcess:
    """The command after its runbook's settings (then `overrides` of them), in `sandbox`."""
    script = "\n".join([*(f"export {s}" for s in command.settings),
                        *(f"export {k}={shlex.quote(v)}" for k, v in (overrides or {}).items()),
                        text or command.text])
    return subprocess.run(["bash", "-c", script], capture_output=True, text=True, timeout=timeout, cwd=sandbox,
                          env=environment())


def argv_of(sandbox: Path, command: Command, text: str) -> list[str]:
    """The words bash passes to the command, after the runbook's settings."""
    script = "\n".join([*(f"export {s}" for s in command.settings), f"eval \"set -- {text}\"",
                        'printf "%s\\0" "$@"'])
    done = subprocess.run(["bash", "-c", script], capture_output=True, text=True, timeout=30, cwd=sandbox)
    assert done.returncode == 0, done.stderr
    return done.stdout.split("\0")[:-1]


def run_python_in_process(argv: list[str], cwd: Path) -> tuple[int, str]:
    """`python -m MODULE ...` or `python FILE ...` in this process: the imports (torch) are paid once
    for all commands instead of once each. Returns (exit status, output)."""
    out = io.StringIO()
    old_argv, old_cwd = sys.argv, os.getcwd()
    try:
        os.chdir(cwd)
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(out):
            try:
                if argv[1] == "-m":
                    sys.argv = [argv[2], *argv[3:]]
                    runpy.run_module(argv[2], run_name="__main__", alter_sys=True)
                else:
                    sys.argv = argv[1:]
                    runpy.run_path(argv[1], run_name="__main__")
                code = 0
            except SystemExit as exc:
                code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
    finally:
        sys.argv = old_argv
        os.chdir(old_cwd)
    return code, out.getvalue()


def promql_of(text: str) -> str:
    words = shlex.split(text)
    return next(w.removeprefix("query=") for w in words if w.startswith("query="))


def server_paths() -> set[str]:
    from sglang_dspark.server import native_api, openai_api

    return {route.path for router in (native_api.router, openai_api.router) for route in router.routes}


# ---- the runbooks as documents ---------------------------------------------------------------------

def test_the_runbooks_exist_and_render_as_markdown():
    names = {p.name for p in RUNBOOKS.glob("*.md")}
    assert {"rollout.md", "reprofile.md", "sts.md", "rollback.md", "alerts.md", "capacity.md", "canary.md"} <= names
    for path in RUNBOOKS.glob("*.md"):
        tokens = MarkdownIt("commonmark").parse(path.read_text())
        assert tokens[0].type == "heading_open" and tokens[0].tag == "h1", path.name
        assert "<h1>" in MarkdownIt("commonmark").render(path.read_text())
        fences = [t for t in tokens if t.type == "fence"]
        assert all(t.info.strip() == "bash" for t in fences), f"{path.name}: every code block is a bash block"


def test_alerts_md_has_a_section_per_alert_at_its_runbook_url():
    alerts = {r["alert"]: r["annotations"]["runbook_url"] for g in yaml.safe_load(ALERT_RULES.read_text())["groups"]
              for r in g["rules"] if "alert" in r}
    tokens = MarkdownIt("commonmark").parse((RUNBOOKS / "alerts.md").read_text())
    sections = {tokens[i + 1].content for i, t in enumerate(tokens) if t.type == "heading_open" and t.tag == "h2"}
    assert set(alerts) == sections
    for name, url in alerts.items():  # GitHub's anchor of "## Name" is the lower-cased name
        assert url == f"ops/runbooks/alerts.md#{name.lower()}"


def test_the_runbooks_cite_only_files_in_the_repository():
    for path in RUNBOOKS.glob("*.md"):
        text = path.read_text()
        assert "shared/" not in text, path.name
        for target in re.findall(r"\]\(([^)#]+)\)", text):
            if not target.startswith("http"):
                assert (path.parent / target).resolve().exists(), f"{path.name} links to {target}"


def test_a_flag_is_found_in_help_only_as_itself():
    assert flag_in_help("--gate", "  --gate NAME  fail when ...\n  --gate-share SHARE")
    assert not flag_in_help("--gate", "  --gate-share SHARE  share of requests")
    assert not flag_in_help("--tier", "  --tiers T")
    assert flag_in_help("--users", "[--users N,N,...]")


def test_every_command_has_a_rule():
    commands = all_commands()
    assert len(commands) > 30
    uncovered = [str(c) for c in commands if c.rule is None]
    assert not uncovered, "no rule in RULES covers:\n" + "\n".join(uncovered)
    assert all(r.how == "run" or r.why for r in RULES), "a command not run as written needs a reason"


# ---- each command, exercised ----------------------------------------------------------------------

@pytest.mark.parametrize("command", all_commands(), ids=str)
def test_runbook_command(command, sandbox):
    rule = command.rule
    assert rule is not None, f"no rule covers {command}"
    if rule.how in ("run", "dry-run"):
        text = command.text + (" --dry-run" if rule.how == "dry-run" else "")
        if text.startswith("python "):
            code, output = run_python_in_process(argv_of(sandbox, command, text), sandbox)
        else:
            done = run_in(sandbox, command, text)
            code, output = done.returncode, done.stdout + done.stderr
        assert code == 0, f"{text}\n{output[-3000:]}"
    elif rule.how == "help":
        usage = help_text(rule.help)
        missing = {f for f in flags(command.text) if not flag_in_help(f, usage)}
        assert not missing, f"{command}: {sorted(missing)} not in `{rule.help}`"
    elif rule.how == "promql":
        expr = promql_of(command.text)
        assert parse_errors({"runbook query": without_variables(expr)}) == []
        unknown = metric_names(expr) - known_names()
        assert not unknown, f"{command}: metrics nobody exports: {sorted(unknown)}"
    elif rule.how == "live":
        assert subprocess.run(["bash", "-n", "-c", command.text]).returncode == 0
        path = re.search(r'"\$HOST(/[\w/]*)"', command.text).group(1)
        assert path in server_paths(), f"{command}: the server has no {path}"
    else:
        pytest.fail(f"unknown exercise {rule.how!r}")


# ---- the slow test: for real on a CPU ---------------------------------------------------------------

def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def reference_server(sandbox, smollm2_dir):
    """A scheduled reference server of SmolLM2 in SLA mode (learning its SPS table from this host's
    profile), warmed up so that every labelled series the runbooks grep for exists."""
    port = _free_port()
    proc = subprocess.Popen([sys.executable, "-m", "sglang_dspark.launch", "--model", smollm2_dir, "--engine",
                             "reference", "--port", str(port), "--max-running", "2", "--max-len", "512",
                             "--profile", str(sandbox / "sla_profiles" / "new-cpu.yaml"), "--sla-tier", "batch"],
                            cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            start_new_session=True)
    try:
        url = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline and proc.poll() is None:
            try:
                if httpx.get(f"{url}/health", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                time.sleep(0.5)
        assert proc.poll() is None, proc.stdout.read()
        for _ in range(2):
            body = {"model": "smollm2-135m-instruct", "messages": [{"role": "user", "content": "Count to five."}],
                    "max_tokens": 8, "temperature": 0}
            assert httpx.post(f"{url}/v1/chat/completions", json=body, timeout=120).status_code == 200
        yield url
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(timeout=60)


def gate_failed(sandbox: Path, text: str, done: subprocess.CompletedProcess) -> bool:
    """A load test that ran and wrote its report, but whose tier gate failed (a busy 2-core CPU may
    miss the interactive tier): the command worked."""
    if "--gate" not in text or done.returncode != 1 or "gate failed:" not in done.stdout + done.stderr:
        return False
    words = shlex.split(text)
    return (sandbox / words[words.index("--out") + 1] / "report.json").is_file()


# in the order an operator meets them: a profile, its STS, the rollout (whose runs rollback.md compares)
SLOW_ORDER = ("reprofile.md", "sts.md", "rollout.md", "capacity.md", "rollback.md", "canary.md", "alerts.md")


@pytest.mark.slow
def test_runbook_commands_run_for_real_on_a_cpu(sandbox, reference_server):
    """Each runbook top to bottom: the commands run as written, and those with `tiny` arguments."""
    assert set(SLOW_ORDER) == {p.name for p in RUNBOOKS.glob("*.md")} - {"README.md"}
    ran = []
    for command in [c for name in SLOW_ORDER for c in runbook_commands(RUNBOOKS / name)]:
        rule = command.rule
        if rule.how != "run" and rule.tiny is None:
            continue  # a GPU, a fleet or a Prometheus server: the fast test's exercise is all there is
        text = f"{command.text} {rule.tiny or ''}".strip()
        done = run_in(sandbox, command, text, {"HOST": reference_server}, timeout=600)
        assert done.returncode == 0 or gate_failed(sandbox, command.text, done), \
            f"{text}\n{done.stdout[-3000:]}{done.stderr[-3000:]}"
        ran.append(command.text)
    written = ["sla_profiles/new-cpu.png", "sla_profiles/learned-cpu.yaml", "runs/sts/report.md",
               "runs/rollout/2-scheduled/report.json", "runs/rollout/report/report.md", "runs/rollback/report/frontier.png",
               "evidence/server_info.json"]
    assert [w for w in written if not (sandbox / w).exists()] == []
    assert json.loads((sandbox / "evidence" / "server_info.json").read_text())
