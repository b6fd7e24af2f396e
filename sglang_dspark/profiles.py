"""SLA profiles: one YAML file with everything the verify scheduler needs for one deployment.

A profile carries the measured step-time table (SPS), the optional confidence calibration (STS),
the SLA tiers offered, and a fingerprint of what it was measured on (engine, hardware, torch /
sglang versions, content hashes of the target and drafter, TP / DP, gamma), so a table measured on
one machine or model is never silently used on another. Upstream SGLang's JSON tables carry no
such fingerprint (SGLANG.md); `SlaProfile.export_sglang` writes them for SGLang's own flags.

    version: 1
    name: smollm2-135m-instruct-dspark-cpu
    fingerprint: {engine: reference, hardware: "cpu: ... x2", torch: 2.14.1, sglang: 0.5.23,
                  target_sha256: ..., draft_sha256: ..., tp: 1, dp: 1, gamma: 7}
    sps:
      cost: {sample_batch_tokens: [...], sample_steps_per_sec: [...], max_batch_tokens: 128}
      additive: null          # or SGLang's SpsAdditiveCostTable fields
      draft_skip_seconds: null  # or per additive.bs_probes: what a budget-0 step saves (no drafter)
      measurements: [{num_requests, batch_tokens, median_ms, p10_ms, p90_ms, repeats}, ...]
    sts: null                 # or SGLang's DSparkStsCalibration fields
    sla_tiers: [{name, tok_s_per_user, ttft_s, max_concurrency}, ...]
    provenance: {command, date, repeats, warmup, host, rounds}

Every error names the field (`fingerprint.gamma: Expected int, got str`); `ProfileError` carries
one line, `<path>: <reason>`.
"""

from __future__ import annotations

import datetime as _dt
import hashlib
import json
import os
import platform
import re
from pathlib import Path
from types import SimpleNamespace

import msgspec
import yaml

from sglang_dspark.core.calibration import StsCalibration
from sglang_dspark.core.sps import SpsAdditiveCostTable, SpsCostTable, SpsTable
from sglang_dspark.drafter.checkpoint import DRAFT_VOCAB_NAME

SCHEMA_VERSION = 1
ENGINES = ("reference", "sglang")
SPS_FILE = "sps_table.json"  # names of the files export_sglang writes
STS_FILE = "sts_calibration.json"


class ProfileError(ValueError):
    """A profile that cannot be used; the message is one line: `<path>: <reason naming the field>`."""


class _Strict(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    pass


class Fingerprint(_Strict):
    engine: str
    hardware: str
    torch: str
    sglang: str | None
    target_sha256: str
    draft_sha256: str | None
    tp: int = 1
    dp: int = 1
    gamma: int = 0

    def __post_init__(self) -> None:
        if self.engine not in ENGINES:
            raise ValueError(f"engine: must be one of {', '.join(ENGINES)}, got {self.engine!r}")
        if self.gamma < 1:
            raise ValueError(f"gamma: must be >= 1, got {self.gamma}")
        for name in ("tp", "dp"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name}: must be >= 1, got {getattr(self, name)}")


class Measurement(_Strict):
    num_requests: int
    batch_tokens: int
    median_ms: float
    p10_ms: float
    p90_ms: float
    repeats: int

    def __post_init__(self) -> None:
        if self.num_requests < 1:
            raise ValueError(f"num_requests: must be >= 1, got {self.num_requests}")
        if self.batch_tokens < self.num_requests:
            raise ValueError(f"batch_tokens: {self.batch_tokens} is below num_requests {self.num_requests}")
        if not 0 < self.p10_ms <= self.median_ms <= self.p90_ms:
            raise ValueError(
                f"median_ms: need 0 < p10_ms <= median_ms <= p90_ms, got {self.p10_ms}, {self.median_ms}, {self.p90_ms}")
        if self.repeats < 1:
            raise ValueError(f"repeats: must be >= 1, got {self.repeats}")


class SpsSection(_Strict):
    cost: SpsCostTable
    additive: SpsAdditiveCostTable | None = None
    # Reference engine only: seconds saved per batch size (additive.bs_probes) when a step's budget
    # is 0 and the drafter is skipped. Not exported: SGLang always drafts.
    draft_skip_seconds: list[float] | None = None
    measurements: list[Measurement] = []

    def __post_init__(self) -> None:
        if self.draft_skip_seconds is not None:
            if self.additive is None:
                raise ValueError("draft_skip_seconds: needs sps.additive (it is aligned with additive.bs_probes)")
            if len(self.draft_skip_seconds) != len(self.additive.bs_probes):
                raise ValueError(f"draft_skip_seconds: {len(self.draft_skip_seconds)} values for "
                                 f"{len(self.additive.bs_probes)} additive.bs_probes")
            if any(not v >= 0 for v in self.draft_skip_seconds):
                raise ValueError(f"draft_skip_seconds: every value must be >= 0, got {self.draft_skip_seconds}")
        keys = [(m.num_requests, m.batch_tokens) for m in self.measurements]
        for i, (a, b) in enumerate(zip(keys, keys[1:])):
            if not a < b:
                raise ValueError(
                    f"measurements[{i + 1}]: rows must be sorted by (num_requests, batch_tokens), strictly "
                    f"increasing; {b} follows {a}")


class SlaTier(_Strict):
    name: str
    tok_s_per_user: float
    ttft_s: float
    max_concurrency: int

    def __post_init__(self) -> None:
        if not self.name:
            raise ValueError("name: must not be empty")
        for field in ("tok_s_per_user", "ttft_s"):
            if not getattr(self, field) > 0:
                raise ValueError(f"{field}: must be > 0, got {getattr(self, field)}")
        if self.max_concurrency < 1:
            raise ValueError(f"max_concurrency: must be >= 1, got {self.max_concurrency}")


class Provenance(_Strict):
    command: str
    date: str
    repeats: int
    warmup: int
    host: str
    rounds: int = 1  # passes over the probes (repeats are per probe per pass)


class SlaProfile(_Strict, kw_only=True):
    version: int
    name: str
    fingerprint: Fingerprint
    sps: SpsSection
    sts: StsCalibration | None = None
    sla_tiers: list[SlaTier] = []
    provenance: Provenance

    def __post_init__(self) -> None:
        if self.version != SCHEMA_VERSION:
            raise ValueError(f"version: this release reads version {SCHEMA_VERSION}, got {self.version}")
        if not self.name:
            raise ValueError("name: must not be empty")
        if self.sts is not None and len(self.sts.temperatures) != self.fingerprint.gamma:
            raise ValueError(
                f"sts.temperatures: {len(self.sts.temperatures)} temperatures, but fingerprint.gamma is "
                f"{self.fingerprint.gamma} (one per draft position)")
        seen: set[str] = set()
        for i, tier in enumerate(self.sla_tiers):
            if tier.name in seen:
                raise ValueError(f"sla_tiers[{i}].name: duplicate tier name {tier.name!r}")
            seen.add(tier.name)

    # -- files ------------------------------------------------------------------------------------
    @classmethod
    def from_yaml(cls, text: str | bytes, source: str = "<profile>") -> SlaProfile:
        try:
            raw = yaml.load(text, Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader))
        except yaml.YAMLError as exc:
            raise ProfileError(f"{source}: not valid YAML ({_one_line(str(exc))})") from None
        if not isinstance(raw, dict):
            raise ProfileError(f"{source}: expected a YAML mapping at the top level, got {type(raw).__name__}")
        _check_nested_keys(raw, source)
        prov = raw.get("provenance")
        if isinstance(prov, dict) and isinstance(prov.get("date"), (_dt.date, _dt.datetime)):
            prov["date"] = _iso(prov["date"])  # an unquoted timestamp is still a date string to us
        try:
            return msgspec.convert(raw, type=cls)
        except (msgspec.ValidationError, ValueError) as exc:
            raise ProfileError(f"{source}: {_field_reason(str(exc))}") from None

    @classmethod
    def load(cls, path: str | Path) -> SlaProfile:
        try:
            text = Path(path).read_bytes()
        except OSError as exc:
            raise ProfileError(f"{path}: cannot read ({exc.strerror or exc})") from None
        return cls.from_yaml(text, str(path))

    def to_yaml(self) -> str:
        data = msgspec.to_builtins(self)
        data["sps"]["measurements"] = [_Flow(m) for m in data["sps"]["measurements"]]
        data["sla_tiers"] = [_Flow(t) for t in data["sla_tiers"]]
        return yaml.dump(data, Dumper=_Dumper, sort_keys=False, allow_unicode=True, width=1 << 16)

    def save(self, path: str | Path) -> None:
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(path.name + ".tmp")
        tmp.write_text(self.to_yaml())
        os.replace(tmp, path)

    # -- what the engines use ---------------------------------------------------------------------
    def sps_table(self) -> SpsTable:
        """The additive table when fitted (it models the per-request cost, and the drafter-skip
        saving when captured), else the 1-D cost table."""
        if self.sps.additive is not None:
            return SpsTable(self.sps.additive, self.sps.draft_skip_seconds)
        return SpsTable(self.sps.cost)

    def sts_temperatures(self):
        """float32 tensor [gamma], or None without a calibration."""
        if self.sts is None:
            return None
        import torch

        return torch.tensor(self.sts.temperatures, dtype=torch.float32)

    def tier(self, name: str) -> SlaTier:
        for tier in self.sla_tiers:
            if tier.name == name:
                return tier
        known = ", ".join(t.name for t in self.sla_tiers) or "none defined"
        raise ProfileError(f"{self.name}: sla_tiers: no tier {name!r} (known: {known})")

    def export_sglang(self, out_dir: str | Path) -> tuple[Path, Path | None]:
        """SGLang JSON for `--speculative-dspark-sps-table-path` (the additive table when present, else
        the cost table) and `--speculative-dspark-confidence-sts-path` (None without STS)."""
        out = Path(out_dir)
        out.mkdir(parents=True, exist_ok=True)
        table = self.sps.additive if self.sps.additive is not None else self.sps.cost
        sps_path = out / SPS_FILE
        sps_path.write_bytes(msgspec.json.encode(table))
        sts_path = None
        if self.sts is not None:
            sts_path = out / STS_FILE
            sts_path.write_bytes(msgspec.json.encode(self.sts))
        return sps_path, sts_path

    def summary(self) -> str:
        fp = self.fingerprint
        kind = "additive" if self.sps.additive is not None else f"cost ({len(self.sps.cost.sample_batch_tokens)} probes)"
        tiers = ",".join(t.name for t in self.sla_tiers) or "none"
        return (f"{self.name}: engine={fp.engine} hardware={fp.hardware!r} gamma={fp.gamma} tp={fp.tp} dp={fp.dp} "
                f"sps={kind} measurements={len(self.sps.measurements)} "
                f"sts={'yes' if self.sts is not None else 'no'} tiers={tiers}")


# -- YAML output ---------------------------------------------------------------------------------
class _Flow(dict):
    """A mapping written on one line (measurement rows, tiers)."""


class _Dumper(yaml.SafeDumper):
    pass


def _represent_list(dumper: yaml.SafeDumper, data: list):
    flow = all(not isinstance(x, (dict, list)) for x in data)  # lists of scalars on one line
    return dumper.represent_sequence("tag:yaml.org,2002:seq", data, flow_style=flow)


def _represent_flow(dumper: yaml.SafeDumper, data: _Flow):
    return dumper.represent_mapping("tag:yaml.org,2002:map", data.items(), flow_style=True)


def _represent_dict(dumper: yaml.SafeDumper, data: dict):
    return dumper.represent_mapping("tag:yaml.org,2002:map", data.items(), flow_style=False)


_Dumper.add_representer(list, _represent_list)
_Dumper.add_representer(_Flow, _represent_flow)
_Dumper.add_representer(dict, _represent_dict)


# -- error messages ------------------------------------------------------------------------------
_AT = re.compile(r"^(?P<reason>.*?)(?: - at `\$(?P<path>[^`]*)`)?$", re.S)
_FIELD_PREFIX = re.compile(r"^(?P<field>[A-Za-z_][\w.\[\]]*): (?P<rest>.*)$", re.S)


def _one_line(text: str) -> str:
    return " ".join(text.split())


def _join(path: str, field: str) -> str:
    if not path:
        return field
    return f"{path}{field}" if field.startswith("[") else f"{path}.{field}"


def _field_reason(message: str) -> str:
    """msgspec's "reason - at `$.a.b`" (and our own "field: reason") as "a.b.field: reason"."""
    m = _AT.match(message.strip())
    reason, path = m.group("reason"), (m.group("path") or "").lstrip(".")
    for pattern, text in ((r"^Object missing required field `([^`]+)`$", "missing required field"),
                          (r"^Object contains unknown field `([^`]+)`$", "unknown field")):
        hit = re.match(pattern, reason)
        if hit:
            return f"{_join(path, hit.group(1))}: {text}"
    hit = _FIELD_PREFIX.match(reason)
    if hit:
        return _one_line(f"{_join(path, hit.group('field'))}: {hit.group('rest')}")
    return _one_line(f"{path or '(top level)'}: {reason}")


def _check_nested_keys(raw: dict, source: str) -> None:
    """The shared SPS/STS structs accept unknown keys (SGLang's JSON is theirs); a profile does not,
    so a misspelt optional field is an error here too."""
    sps = raw.get("sps") if isinstance(raw.get("sps"), dict) else {}
    for path, value, kind in (("sps.cost", sps.get("cost"), SpsCostTable),
                              ("sps.additive", sps.get("additive"), SpsAdditiveCostTable),
                              ("sts", raw.get("sts"), StsCalibration)):
        if isinstance(value, dict):
            unknown = sorted(set(map(str, value)) - set(kind.__struct_fields__))
            if unknown:
                raise ProfileError(f"{source}: {path}.{unknown[0]}: unknown field")


def _iso(value) -> str:
    if isinstance(value, _dt.datetime):
        if value.tzinfo is None or value.utcoffset() == _dt.timedelta(0):
            return value.replace(tzinfo=None).isoformat() + "Z"
        return value.isoformat()
    return value.isoformat()


def utc_now() -> str:
    return _dt.datetime.now(_dt.timezone.utc).replace(microsecond=0, tzinfo=None).isoformat() + "Z"


# -- fingerprints --------------------------------------------------------------------------------
def hardware_id() -> str:
    """"cuda: <device name> x<count>" with CUDA, else "cpu: <model name> x<logical cpus>"."""
    try:
        import torch

        if torch.cuda.is_available():
            return f"cuda: {torch.cuda.get_device_name(0)} x{torch.cuda.device_count()}"
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


def _weight_files(path: Path) -> list[Path]:
    names = sorted({p.name for p in path.glob("*.safetensors")})
    files = ([path / "config.json"] if (path / "config.json").is_file() else []) + [path / n for n in names]
    # a drafter's hot vocabulary changes both its cost and its acceptance, so it is part of its identity
    vocab = path / DRAFT_VOCAB_NAME
    return files + ([vocab] if vocab.is_file() else [])


def dir_sha256(path: str | Path) -> str:
    """sha256 over config.json, *.safetensors and a drafter's draft_vocab.pt (sorted names; each
    file's name, size and bytes, streamed). ProfileError when `path` is not a directory."""
    path = Path(path)
    if not path.is_dir():
        raise ProfileError(f"{path}: not a local directory, cannot hash its contents")
    digest = hashlib.sha256()
    for file in _weight_files(path):
        digest.update(f"{file.name}\0{file.stat().st_size}\0".encode())
        with open(file, "rb") as f:
            while chunk := f.read(1 << 22):
                digest.update(chunk)
    return digest.hexdigest()


def draft_gamma(draft_dir: str | Path) -> int:
    """The drafter's block size from its config.json (top level or DFlash's `dflash_config`), else
    SGLang's default 7."""
    try:
        config = json.loads((Path(draft_dir) / "config.json").read_text())
    except (OSError, ValueError):
        return 7
    value = config.get("block_size") or (config.get("dflash_config") or {}).get("block_size")
    return int(value) if value else 7


def _versions() -> tuple[str, str | None]:
    from importlib import metadata

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


def fingerprint_for(*, engine: str, target_dir, draft_dir, gamma: int, tp: int = 1, dp: int = 1) -> Fingerprint:
    """The fingerprint of this machine and these model directories (content hashes)."""
    torch_version, sglang_version = _versions()
    return Fingerprint(
        engine=engine, hardware=hardware_id(), torch=torch_version, sglang=sglang_version,
        target_sha256=dir_sha256(target_dir), draft_sha256=dir_sha256(draft_dir) if draft_dir is not None else None,
        tp=tp, dp=dp, gamma=gamma)


_IDENTITY_FIELDS = ("engine", "hardware", "target_sha256", "draft_sha256", "tp", "dp", "gamma")
_VERSION_FIELDS = ("torch", "sglang")


def fingerprint_mismatches(profile_fp: Fingerprint, actual: Fingerprint) -> list[str]:
    """One line per difference, e.g. "gamma: profile 7, actual 5"; library versions come last as
    "version torch: profile '2.14.1', actual '2.15.0'"."""
    out = []
    for name in _IDENTITY_FIELDS:
        want, have = getattr(profile_fp, name), getattr(actual, name)
        if want != have:
            fmt = (lambda v: repr(v)) if isinstance(want, str) or isinstance(have, str) else str
            out.append(f"{name}: profile {fmt(want)}, actual {fmt(have)}")
    for name in _VERSION_FIELDS:
        want, have = getattr(profile_fp, name), getattr(actual, name)
        if want != have:
            out.append(f"version {name}: profile {want!r}, actual {have!r}")
    return out


def check_fingerprint(profile: SlaProfile, *, engine: str, target_dir, draft_dir, gamma: int | None = None,
                      tp: int = 1, dp: int = 1) -> list[str]:
    """Mismatches between `profile` and this machine + these directories; a directory that cannot be
    hashed (a hub id) is itself a mismatch line. gamma defaults to the drafter's block size."""
    torch_version, sglang_version = _versions()
    lines = []
    hashes = {}
    for name, d in (("target_sha256", target_dir), ("draft_sha256", draft_dir)):
        if d is None:
            hashes[name] = None
            continue
        try:
            hashes[name] = dir_sha256(d)
        except ProfileError:
            hashes[name] = getattr(profile.fingerprint, name)
            lines.append(f"{name}: {d} is not a local directory, its content cannot be checked")
    if gamma is None:
        gamma = draft_gamma(draft_dir) if draft_dir is not None and Path(draft_dir).is_dir() else (
            profile.fingerprint.gamma if draft_dir is not None else 0)
    # a namespace, not a Fingerprint: "no drafter" (gamma 0) must be comparable, not refused
    actual = SimpleNamespace(engine=engine, hardware=hardware_id(), torch=torch_version, sglang=sglang_version,
                             tp=tp, dp=dp, gamma=gamma, **hashes)
    return lines + fingerprint_mismatches(profile.fingerprint, actual)
