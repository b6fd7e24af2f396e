"""What a profile was measured on, and whether that is what is about to run.

A fingerprint names the engine, the hardware, torch / SGLang versions, content hashes of the target
and drafter directories, TP / DP and gamma. `check` lists every difference between a profile and a
deployment, one line each; `require_match` is the single place that turns differences into a
refusal, or, forced, into a warning.
"""

from __future__ import annotations

import json
import logging
import os
import platform
from importlib import metadata
from pathlib import Path
from types import SimpleNamespace

from sglang_dspark import zoo
from sglang_dspark.profile.schema import Fingerprint, ProfileError, SlaProfile

logger = logging.getLogger(__name__)

IDENTITY_FIELDS = ("engine", "hardware", "target_sha256", "draft_sha256", "tp", "dp", "gamma")
VERSION_FIELDS = ("torch", "sglang")


def hardware_id() -> str:
    """"cuda: <device name> x<count> (driver <version>, cuda <version>)" with CUDA (a driver or CUDA
    upgrade moves step times, so it is a different machine to a profile), else
    "cpu: <model name> x<logical cpus>"."""
    try:
        import torch

        if torch.cuda.is_available():
            return (f"cuda: {torch.cuda.get_device_name(0)} x{torch.cuda.device_count()} "
                    f"(driver {_driver_version()}, cuda {torch.version.cuda})")
    except Exception:  # no torch / broken driver: describe the CPU
        pass
    model = ""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.lower().startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return f"cpu: {model or platform.processor() or platform.machine() or 'unknown'} x{os.cpu_count() or 1}"


def _driver_version() -> str:
    try:
        import pynvml

        pynvml.nvmlInit()
        version = pynvml.nvmlSystemGetDriverVersion()
        return version.decode() if isinstance(version, bytes) else str(version)
    except Exception:  # no NVML (not NVIDIA, a container without it): say so rather than guess
        return "unknown"


def dir_sha256(path: str | Path) -> str:
    """The content hash of a model directory (zoo.dir_sha256); ProfileError when it is not one."""
    try:
        return zoo.dir_sha256(path)
    except zoo.ZooError as exc:
        raise ProfileError(str(exc)) from None


def draft_gamma(draft_dir: str | Path) -> int:
    """The drafter's block size from its config.json (top level or DFlash's `dflash_config`), else
    SGLang's default 7."""
    try:
        config = json.loads((Path(draft_dir) / "config.json").read_text())
    except (OSError, ValueError):
        return 7
    value = config.get("block_size") or (config.get("dflash_config") or {}).get("block_size")
    return int(value) if value else 7


def library_versions() -> tuple[str, str | None]:
    """(torch version, sglang version or None)."""
    try:
        import torch

        torch_version = str(torch.__version__)
    except Exception:
        torch_version = "none"
    try:
        sglang_version = metadata.version("sglang")
    except metadata.PackageNotFoundError:
        sglang_version = None
    return torch_version, sglang_version


def fingerprint_for(*, engine: str, target_dir, draft_dir, gamma: int, tp: int = 1, dp: int = 1,
                    hardware: str | None = None, target_sha256: str | None = None,
                    draft_sha256: str | None = None, weight_format: str | None = None) -> Fingerprint:
    """The fingerprint of this machine (or `hardware`) and these model directories (content hashes,
    unless given); `weight_format`: the reference engine's."""
    torch_version, sglang_version = library_versions()
    return Fingerprint(
        engine=engine, hardware=hardware or hardware_id(), torch=torch_version, sglang=sglang_version,
        target_sha256=target_sha256 or dir_sha256(target_dir),
        draft_sha256=draft_sha256 or (dir_sha256(draft_dir) if draft_dir is not None else None),
        tp=tp, dp=dp, gamma=gamma, weight_format=weight_format)


def mismatches(profile_fp: Fingerprint, actual) -> list[str]:
    """One line per difference, e.g. "gamma: profile 7, actual 5"; library versions come last as
    "version torch: profile '2.14.1', actual '2.15.0'"."""
    out = []
    for name in IDENTITY_FIELDS:
        want, have = getattr(profile_fp, name), getattr(actual, name)
        if want != have:
            fmt = repr if isinstance(want, str) or isinstance(have, str) else str
            out.append(f"{name}: profile {fmt(want)}, actual {fmt(have)}")
    for name in VERSION_FIELDS:
        want, have = getattr(profile_fp, name), getattr(actual, name)
        if want != have:
            out.append(f"version {name}: profile {want!r}, actual {have!r}")
    return out


def check(profile: SlaProfile, *, engine: str, target_dir, draft_dir, gamma: int | None = None,
          tp: int = 1, dp: int = 1, weight_format: str | None = None) -> list[str]:
    """Differences between `profile` and this machine + these directories. A directory not given
    (None) is not compared; one that cannot be hashed (a hub id) is itself a difference. gamma
    defaults to the drafter's block size. `weight_format` (the reference engine's, when known) is
    compared with the profile's, float32 for profiles that predate the field."""
    torch_version, sglang_version = library_versions()
    lines, hashes = [], {}
    for name, d in (("target_sha256", target_dir), ("draft_sha256", draft_dir)):
        hashes[name] = getattr(profile.fingerprint, name)
        if d is None:
            continue
        try:
            hashes[name] = dir_sha256(d)
        except ProfileError:
            lines.append(f"{name}: {d} is not a local directory, its content cannot be checked")
    if gamma is None:
        gamma = draft_gamma(draft_dir) if draft_dir is not None and Path(draft_dir).is_dir() else profile.fingerprint.gamma
    # a namespace, not a Fingerprint: "no drafter" must be comparable, not refused
    actual = SimpleNamespace(engine=engine, hardware=hardware_id(), torch=torch_version, sglang=sglang_version,
                             tp=tp, dp=dp, gamma=gamma, **hashes)
    lines += mismatches(profile.fingerprint, actual)
    measured_in = profile.fingerprint.weight_format or "float32"
    if weight_format is not None and profile.fingerprint.engine == "reference" and measured_in != weight_format:
        lines.append(f"weight_format: profile {measured_in!r}, actual {weight_format!r}")
    return lines


def require_match(source: str, lines: list[str], *, force: bool, hint: str = "") -> list[str]:
    """Refuse (ProfileError, one line) when `lines` lists differences, unless `force`, which logs
    them and returns them."""
    if lines and not force:
        raise ProfileError(f"{source}: fingerprint does not match{hint}: " + "; ".join(lines))
    if lines:
        logger.warning("profile %s does not match, used anyway: %s", source, "; ".join(lines))
    return lines
