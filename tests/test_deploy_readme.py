"""README's "Deploying": every command of its bash blocks is checked, as far as this machine can
(no cluster, no registry, no Docker daemon, no systemd as init). Renders run for real with the
pinned kubectl; `kubectl apply` gets what that render gives (the apply itself needs a cluster);
`docker build` names a recipe that exists and the image tag the manifests run; `kubectl rollout`
and `kubectl delete` name objects the overlays render; `systemctl` names units that exist. A
command this test does not know fails it."""

from __future__ import annotations

import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
from deploy_manifests import DEPLOY, KUBECTL, OVERLAYS, containers, kustomize_dir, render

ROOT = Path(__file__).resolve().parents[1]


def section_commands() -> list[str]:
    text = (ROOT / "README.md").read_text()
    section = re.search(r"^## Deploying\n(.*?)(?=^## )", text, re.S | re.M).group(1)
    return [line.strip() for block in re.findall(r"```bash\n(.*?)```", section, re.S)
            for line in block.replace("\\\n", " ").splitlines() if line.strip() and not line.startswith("#")]


COMMANDS = section_commands()


def _kustomize_target(words: list[str]) -> Path:
    path = ROOT / words[-1]
    assert path.resolve().parent.is_relative_to(DEPLOY / "k8s") and (path / "kustomization.yaml").exists(), words
    return path


def _render(words: list[str]) -> str:
    assert words[:2] == ["kubectl", "kustomize"], words
    done = subprocess.run([str(KUBECTL), *words[1:]], capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert done.returncode == 0 and done.stdout.strip(), done.stderr
    return done.stdout


def _rendered_names(kind: str) -> set[str]:
    return {d["metadata"]["name"] for name in OVERLAYS for d in render(name) if d["kind"] == kind}


def check(command: str) -> None:
    if " | " in command:  # render | kubectl apply -f -
        left, right = command.split(" | ")
        assert shlex.split(right) == ["kubectl", "apply", "-f", "-"], command
        _render(shlex.split(left))
        return
    words = shlex.split(command)
    match words:
        case ["kubectl", "kustomize", *_]:
            _render(words)
        case ["kubectl", "apply" | "delete", "-k", _]:
            target = _kustomize_target(words)
            assert target.name in OVERLAYS and kustomize_dir(target.name) == target
            _render(["kubectl", "kustomize", str(target)])
        case ["kubectl", "rollout", "restart" | "status" | "undo", ref]:
            kind, _, name = ref.partition("/")
            assert kind == "deployment" and name in _rendered_names("Deployment"), ref
        case ["docker", "build", "-f", recipe, "-t", tag, "."]:
            assert (ROOT / recipe).exists() and recipe.startswith("deploy/container/"), recipe
            flavour = Path(recipe).name.split(".")[0]  # cpu | gpu: the image the manifests run
            images = {c["image"] for name in OVERLAYS for _, c in containers(name)}
            assert tag in images and f"/{flavour}:" in tag, (tag, sorted(images))
        case ["python", "deploy/monitoring.py", *args]:
            done = subprocess.run([sys.executable, "deploy/monitoring.py", *args], cwd=ROOT, capture_output=True,
                                  text=True, timeout=60)
            assert done.returncode == 0, done.stderr
        case ["systemctl", "enable" | "restart", *units]:
            units = [u for u in units if not u.startswith("--")]
            for unit in units:
                template = re.sub(r"@[^.]*$", "@", unit) + ".service"
                assert (DEPLOY / "systemd" / template).exists(), unit
        case _:
            raise AssertionError(f"no check for: {command}")


def test_the_section_has_build_apply_rollout_rollback_commands():
    assert any(c.startswith("docker build") for c in COMMANDS)
    assert any("kubectl apply" in c for c in COMMANDS)
    assert any(c.startswith("kubectl rollout restart") for c in COMMANDS)
    assert any(c.startswith("kubectl rollout undo") for c in COMMANDS)


@pytest.mark.parametrize("command", COMMANDS)
def test_deploying_command(command):
    check(command)
