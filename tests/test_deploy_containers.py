"""deploy/container: the recipes' RUN steps run here, in a venv standing in for the base image, so a
recipe that cannot install the bundle fails. These machines have no registry and no Docker daemon:
no image is built or pulled. What stands in for each base image:

  gpu.Dockerfile  lmsysorg/sglang: a venv that sees this project's environment (torch, SGLang
                  0.5.23 and the rest, as the image has them) without the bundle. The install step
                  must leave every torch / CUDA / SGLang package as it was, and the plugin check
                  (`python -m sglang_dspark.sglang_plugin`) must pass.
  cpu.Dockerfile  python:3.11-slim: a venv with only torch (and what torch needs) from this
                  environment, standing in for the step that installs torch's CPU build from
                  download.pytorch.org (not reachable here; the only step not run). The install
                  step fetches the rest from the package index.

Slow (the two install tests): each installs the bundle into a fresh venv (about a minute, more when it downloads)."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from importlib import metadata
from pathlib import Path

import pytest
from packaging.requirements import Requirement

ROOT = Path(__file__).resolve().parents[1]
RECIPES = ROOT / "deploy" / "container"
SITE = Path(next(p for p in sys.path if p.endswith("site-packages")))
OWN = re.compile(r"^(_*editable_*)?sglang_dspark", re.I)  # the bundle's own files in site-packages
IMAGE_OWNED = re.compile(r"^(torch|torchvision|torchaudio|triton|nvidia-[a-z0-9-]+|sglang|sgl-kernel|flashinfer[a-z0-9-]*)==",
                         re.I)


def instructions(recipe: Path) -> list[tuple[str, str]]:
    """(INSTRUCTION, rest) of a Dockerfile, continuations joined, comments dropped."""
    text = re.sub(r"\\\n\s*", " ", recipe.read_text())
    return [(m.group(1).upper(), m.group(2)) for line in text.splitlines()
            if (m := re.match(r"^\s*([A-Za-z]+)\s+(.*)$", line)) and not line.lstrip().startswith("#")]


def _closure(name: str) -> set[str]:
    """`name` and every distribution it requires here (markers evaluated), by normalised name."""
    seen, todo = set(), [name]
    while todo:
        dist = metadata.distribution(todo.pop())
        key = dist.metadata["Name"].lower().replace("_", "-")
        if key in seen:
            continue
        seen.add(key)
        for req in map(Requirement, dist.requires or []):
            if req.marker is None or req.marker.evaluate({"extra": ""}):
                todo.append(req.name)
    return seen


def _top_level(dist: metadata.Distribution) -> set[str]:
    return {Path(str(f)).parts[0] for f in dist.files or [] if not str(f).startswith("..")}


def image_venv(tmp: Path, only: set[str] | None) -> Path:
    """A venv whose site-packages sees this environment's packages (all, or the distributions in
    `only`) through a .pth, as a base image's Python has them; never the bundle itself."""
    overlay, venv = tmp / "image-site", tmp / "venv"
    overlay.mkdir()
    entries = {e.name for e in SITE.iterdir()}
    if only is not None:
        entries = set().union(*(_top_level(d) for d in metadata.distributions()
                                if d.metadata["Name"].lower().replace("_", "-") in only)) & entries
    for name in entries:
        if not OWN.match(name) and name not in ("__pycache__", "pip", "setuptools") and not name.endswith(".pth") \
                and not name.startswith(("pip-", "setuptools-")):
            (overlay / name).symlink_to(SITE / name)
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=300)
    (next((venv / "lib").glob("python*")) / "site-packages" / "image.pth").write_text(f"{overlay}\n")
    return venv


def context(tmp: Path, recipe: Path) -> Path:
    """The build context the recipe's .dockerignore lets through (it allows a few paths only)."""
    allowed = [line[1:].rstrip("/") for line in (recipe.parent / f"{recipe.name}.dockerignore").read_text().splitlines()
               if line.startswith("!")]
    ctx = tmp / "context"
    for rel in allowed:
        src = ROOT / rel
        if src.is_dir():
            shutil.copytree(src, ctx / rel, ignore=shutil.ignore_patterns("__pycache__"))
        else:
            (ctx / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, ctx / rel)
    return ctx


def run_steps(recipe: Path, venv: Path, ctx: Path) -> list[str]:
    """Every RUN step that can run here, in order; returns those that cannot (and why)."""
    env = {**os.environ, "PATH": f"{venv / 'bin'}:{os.environ['PATH']}", "VIRTUAL_ENV": str(venv)}
    env.pop("PYTHONPATH", None)
    skipped = []
    for op, rest in instructions(recipe):
        if op == "ENV":
            env.update(dict(w.split("=", 1) for w in rest.split()))
        elif op == "RUN":
            if "download.pytorch.org" in rest:
                skipped.append(f"{rest} (download.pytorch.org is not reachable from these machines)")
                continue
            done = subprocess.run(["bash", "-o", "pipefail", "-c", rest], cwd=ctx, env=env, capture_output=True,
                                  text=True, timeout=1200)
            assert done.returncode == 0, f"RUN {rest}\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
    return skipped


def _freeze(venv: Path) -> list[str]:
    done = subprocess.run([str(venv / "bin" / "pip"), "list", "--format=freeze"], capture_output=True, text=True,
                          timeout=120, check=True)
    return done.stdout.splitlines()


def _installed_from(venv: Path) -> str:
    done = subprocess.run([str(venv / "bin" / "python"), "-c", "import sglang_dspark; print(sglang_dspark.__file__)"],
                          capture_output=True, text=True, timeout=120, cwd=venv, check=True)
    return done.stdout.strip()


def test_the_recipes_pin_their_base_images():
    for recipe in sorted(RECIPES.glob("*.Dockerfile")):
        (base,) = [rest for op, rest in instructions(recipe) if op == "FROM"]
        image, _, tag = base.partition(":")
        assert tag and tag != "latest", (recipe.name, base)
        assert ("0.5.23" in tag) == (recipe.name == "gpu.Dockerfile"), base  # SGLang's own 0.5.23 image
        entry = [rest for op, rest in instructions(recipe) if op == "ENTRYPOINT"]
        assert entry == ['["python", "-m", "sglang_dspark.launch"]'], recipe.name


@pytest.mark.slow
def test_the_gpu_recipe_installs_the_bundle_into_sglangs_environment_untouched(tmp_path):
    recipe = RECIPES / "gpu.Dockerfile"
    venv = image_venv(tmp_path, only=None)
    before = [line for line in _freeze(venv) if IMAGE_OWNED.match(line)]
    assert any(line.startswith("sglang==0.5.23") for line in before) and any(line.startswith("torch==") for line in before)
    assert run_steps(recipe, venv, context(tmp_path, recipe)) == []  # every step ran, the plugin check too
    assert [line for line in _freeze(venv) if IMAGE_OWNED.match(line)] == before
    assert _installed_from(venv).startswith(str(venv))


@pytest.mark.slow
def test_the_cpu_recipe_installs_the_bundle_and_its_router_on_torch_alone(tmp_path):
    recipe = RECIPES / "cpu.Dockerfile"
    venv = image_venv(tmp_path, only=_closure("torch"))
    before = _freeze(venv)
    assert not any(line.lower().startswith(("sglang", "transformers", "locust")) for line in before), before
    skipped = run_steps(recipe, venv, context(tmp_path, recipe))
    assert len(skipped) == 1 and "torch==2.14.1+cpu" in skipped[0], skipped
    after = _freeze(venv)
    assert [x for x in after if x.startswith("torch==")] == [x for x in before if x.startswith("torch==")]
    assert "sglang-router==0.3.2" in after and "locust==2.47.0" in after
    assert _installed_from(venv).startswith(str(venv))
