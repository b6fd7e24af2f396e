"""Loud failure: `launch --engine sglang` checks, in the interpreter it will exec, that SGLang will
load the plugin, and exits 2 with the reason before exec; the plugin, standing down, logs at ERROR
and exports `sglang_dspark_plugin_active` 0. The interpreters are this venv minus the bundle's
entry point, or with another SGLang version's metadata (a copy of this venv's packages, linked)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from test_profiles import make_model_dirs

# subprocess launches in throwaway venvs (about 10 s each): run with the slow suite, as CI does
pytestmark = [pytest.mark.sglang, pytest.mark.slow]

SITE = Path(next(p for p in sys.path if p.endswith("site-packages") and Path(p).is_dir()))


def _interpreter(root: Path, drop: str | None = None, sglang_version: str | None = None) -> str:
    """A venv whose site-packages links this one's, without `drop`, and with sglang's metadata
    saying `sglang_version` when given."""
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(root)], check=True, timeout=120)
    site = next((root / "lib").glob("python*/site-packages"))
    for entry in SITE.iterdir():
        if entry.name == drop or (sglang_version and entry.name.startswith("sglang-") and entry.suffix == ".dist-info"):
            continue
        (site / entry.name).symlink_to(entry)
    if sglang_version:
        original = next(SITE.glob("sglang-*.dist-info"))
        copy = site / f"sglang-{sglang_version}.dist-info"
        shutil.copytree(original, copy)
        meta = copy / "METADATA"
        meta.write_text("".join(f"Version: {sglang_version}\n" if line.startswith("Version: ") else line
                                for line in meta.read_text().splitlines(keepends=True)))
    return str(root / "bin" / "python")


def _launch(python: str, tmp_path: Path) -> subprocess.CompletedProcess:
    target, draft = make_model_dirs(tmp_path, gamma=3)
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HOME": str(tmp_path / "home")}
    env.pop("SGLANG_PLUGINS", None)
    return subprocess.run([python, "-m", "sglang_dspark.launch", "--engine", "sglang", "--mode", "full", "--model",
                           str(target), "--draft", str(draft)], capture_output=True, text=True, env=env, timeout=300,
                          cwd=tmp_path)


def test_a_missing_entry_point_stops_the_launch_before_exec(tmp_path):
    dist = next(SITE.glob("sglang_dspark-*.dist-info")).name
    done = _launch(_interpreter(tmp_path / "venv", drop=dist), tmp_path)
    err = [line for line in done.stderr.splitlines() if line.startswith("error: ")]
    assert done.returncode == 2 and len(err) == 1, done.stderr[-2000:]
    assert "entry point sglang.srt.plugins:sglang_dspark is not installed" in err[0]
    assert "sglang.launch_server" not in done.stdout + done.stderr  # SGLang was never started


def test_another_sglang_version_stops_the_launch_before_exec(tmp_path):
    done = _launch(_interpreter(tmp_path / "venv", sglang_version="0.5.24"), tmp_path)
    err = [line for line in done.stderr.splitlines() if line.startswith("error: ")]
    assert done.returncode == 2 and len(err) == 1, done.stderr[-2000:]
    assert "sglang 0.5.24 is installed; the hooks were tested against 0.5.23" in err[0]


def test_standing_down_logs_an_error_and_exports_plugin_active_0(tmp_path):
    code = textwrap.dedent("""
        import json, logging
        from importlib import metadata
        logging.basicConfig(level=logging.INFO)
        from prometheus_client import CollectorRegistry
        from prometheus_client.multiprocess import MultiProcessCollector
        import sglang_dspark.sglang_plugin as plugin

        def active():
            registry = CollectorRegistry()
            MultiProcessCollector(registry)
            return [s.value for f in registry.collect() for s in f.samples if s.name == plugin.ACTIVE_METRIC]

        real = metadata.version
        metadata.version = lambda name: "0.5.24" if name == "sglang" else real(name)
        plugin.register()
        down = active()
        metadata.version = real
        plugin.register()
        print(json.dumps({"down": down, "up": active()}))
    """)
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300,
                          env={**os.environ, "HF_HUB_OFFLINE": "1", "PROMETHEUS_MULTIPROC_DIR": str(tmp_path)})
    assert done.returncode == 0, done.stderr[-2000:]
    assert json.loads(done.stdout.strip().splitlines()[-1]) == {"down": [0.0], "up": [1.0]}
    refusal = [line for line in done.stderr.splitlines() if "plugin NOT registered" in line]
    assert len(refusal) == 1 and refusal[0].startswith("ERROR:") and "sglang 0.5.24" in refusal[0]
