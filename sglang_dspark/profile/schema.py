"""The SLA profile: one YAML file with everything the verify scheduler needs for one deployment.

A profile carries the measured step-time table (SPS), the optional confidence calibration (STS),
the SLA tiers offered, and a fingerprint of what it was measured on (engine, hardware, torch /
sglang versions, content hashes of the target and drafter, TP / DP, gamma), so a table measured on
one machine or model is never silently used on another. SGLang's own JSON tables carry no such
fingerprint; `SlaProfile.export_sglang` writes them for SGLang's flags.

    version: 1
    name: smollm2-135m-instruct-cpu
    fingerprint: {engine: reference, hardware: "cpu: ... x2", torch: 2.14.1, sglang: 0.5.23,
                  target_sha256: ..., draft_sha256: ..., tp: 1, dp: 1, gamma: 7}
    sps:
      cost: {sample_batch_tokens: [...], sample_steps_per_sec: [...], max_batch_tokens: 128}
      additive: null          # or SGLang's SpsAdditiveCostTable fields
      draft_skip_seconds: null  # or per additive.bs_probes: what a budget-0 step saves (no drafter)
      measurements: [{num_requests, batch_tokens, median_ms, p10_ms, p90_ms, repeats}, ...]
    sts: null                 # or SGLang's DSparkStsCalibration fields
    sla_tiers: [{name, tok_s_per_user, ttft_s, max_concurrency}, ...]
    provenance: {command, date, repeats, warmup, host, rounds, source}

Every error is one line naming the field: `<file>: fingerprint.gamma: Input should be a valid
integer, got str '7'` (`ProfileError`).
"""

from __future__ import annotations

import datetime as _dt
import os
from pathlib import Path

import yaml
from pydantic import ValidationError, field_validator, model_validator

from sglang_dspark.core.calibration import StsCalibration
from sglang_dspark.core.schema import FieldError, StrictModel, error_line
from sglang_dspark.core.sps import SpsAdditiveCostTable, SpsCostTable, SpsTable

SCHEMA_VERSION = 1
ENGINES = ("reference", "sglang")
SOURCES = ("capture", "capture-http", "snapshot")  # how the table was measured
SPS_FILE = "sps_table.json"  # names of the files export_sglang writes
STS_FILE = "sts_calibration.json"


class ProfileError(ValueError):
    """A profile that cannot be used; the message is one line: `<path>: <reason naming the field>`."""


class Fingerprint(StrictModel):
    engine: str
    hardware: str
    torch: str
    sglang: str | None
    target_sha256: str
    draft_sha256: str | None
    tp: int = 1
    dp: int = 1
    gamma: int = 0
    # the reference engine's weight format (engine/cpu/formats.py); profiles before the field were
    # float32. SGLang's own dtype flags are SGLang's: None there.
    weight_format: str | None = None

    @model_validator(mode="after")
    def _check(self) -> Fingerprint:
        if self.engine not in ENGINES:
            raise FieldError("engine", f"must be one of {', '.join(ENGINES)}, got {self.engine!r}")
        if self.gamma < 1:
            raise FieldError("gamma", f"must be >= 1, got {self.gamma}")
        for name in ("tp", "dp"):
            if getattr(self, name) < 1:
                raise FieldError(name, f"must be >= 1, got {getattr(self, name)}")
        return self


class Measurement(StrictModel):
    """One probe: the step times measured at `num_requests` requests and `batch_tokens` verify tokens."""

    num_requests: int
    batch_tokens: int
    median_ms: float
    p10_ms: float
    p90_ms: float
    repeats: int

    @model_validator(mode="after")
    def _check(self) -> Measurement:
        if self.num_requests < 1:
            raise FieldError("num_requests", f"must be >= 1, got {self.num_requests}")
        if self.batch_tokens < self.num_requests:
            raise FieldError("batch_tokens", f"{self.batch_tokens} is below num_requests {self.num_requests}")
        if not 0 < self.p10_ms <= self.median_ms <= self.p90_ms:
            raise FieldError("median_ms", "need 0 < p10_ms <= median_ms <= p90_ms, got "
                             f"{self.p10_ms}, {self.median_ms}, {self.p90_ms}")
        if self.repeats < 1:
            raise FieldError("repeats", f"must be >= 1, got {self.repeats}")
        return self


class SpsSection(StrictModel):
    cost: SpsCostTable
    additive: SpsAdditiveCostTable | None = None
    # Reference engine only: seconds saved per batch size (additive.bs_probes) when a step's budget
    # is 0 and the drafter is skipped. Not exported: SGLang always drafts.
    draft_skip_seconds: list[float] | None = None
    measurements: list[Measurement] = []

    @model_validator(mode="after")
    def _check(self) -> SpsSection:
        if self.draft_skip_seconds is not None:
            if self.additive is None:
                raise FieldError("draft_skip_seconds", "needs sps.additive (it is aligned with additive.bs_probes)")
            if len(self.draft_skip_seconds) != len(self.additive.bs_probes):
                raise FieldError("draft_skip_seconds", f"{len(self.draft_skip_seconds)} values for "
                                 f"{len(self.additive.bs_probes)} additive.bs_probes")
            if any(not v >= 0 for v in self.draft_skip_seconds):
                raise FieldError("draft_skip_seconds", f"every value must be >= 0, got {self.draft_skip_seconds}")
        keys = [(m.num_requests, m.batch_tokens) for m in self.measurements]
        for i, (a, b) in enumerate(zip(keys, keys[1:])):
            if not a < b:
                raise FieldError(f"measurements[{i + 1}]", "rows must be sorted by (num_requests, batch_tokens), "
                                 f"strictly increasing; {b} follows {a}")
        return self

    def table(self) -> SpsTable:
        """The additive table when fitted (it models the per-request cost, and the drafter-skip
        saving when captured), else the 1-D cost table."""
        if self.additive is not None:
            return SpsTable(self.additive, self.draft_skip_seconds)
        return SpsTable(self.cost)


class SlaTier(StrictModel):
    name: str
    tok_s_per_user: float
    ttft_s: float
    max_concurrency: int

    @model_validator(mode="after")
    def _check(self) -> SlaTier:
        if not self.name:
            raise FieldError("name", "must not be empty")
        for name in ("tok_s_per_user", "ttft_s"):
            if not getattr(self, name) > 0:
                raise FieldError(name, f"must be > 0, got {getattr(self, name)}")
        if self.max_concurrency < 1:
            raise FieldError("max_concurrency", f"must be >= 1, got {self.max_concurrency}")
        return self

    @classmethod
    def parse(cls, text: str, single_stream_tok_s: float | None = None) -> SlaTier:
        """NAME:TOK_S_PER_USER:TTFT_S:MAX_CONCURRENCY, e.g. interactive:20:2:4 (the CLIs' --tier).
        TOK_S_PER_USER may be xF: F times `single_stream_tok_s`, the speed of one request alone on
        the table being written (`single_stream_speed`), so a tier is set by what the engine
        measured rather than by a number that goes stale with every faster build."""
        parts = text.split(":")
        if len(parts) != 4:
            raise ProfileError(f"--tier {text}: expected NAME:TOK_S_PER_USER:TTFT_S:MAX_CONCURRENCY")
        try:
            tok_s = parts[1]
            if tok_s.startswith("x"):
                if single_stream_tok_s is None:
                    raise ValueError("a relative speed (xF) needs the single-stream speed of a measured table")
                tok_s = float(tok_s[1:]) * single_stream_tok_s
            return cls(name=parts[0], tok_s_per_user=round(float(tok_s), 1), ttft_s=float(parts[2]),
                       max_concurrency=int(parts[3]))
        except ValidationError as exc:
            raise ProfileError(f"--tier {text}: {error_line(exc)}") from None
        except ValueError as exc:
            raise ProfileError(f"--tier {text}: {exc}") from None


def single_stream_speed(table: SpsTable) -> float:
    """Tokens per second of one request alone, not drafting: what relative tiers are fractions of."""
    return float(table(1, num_requests=1, drafted=False))


def parse_tiers(specs: list[str], table: SpsTable | None = None) -> list[SlaTier]:
    """The CLIs' --tier values; without `table` relative ones are checked against a stand-in speed
    (to fail before a long capture), with it they are resolved against its single-stream speed."""
    speed = 1.0 if table is None else single_stream_speed(table)
    return [SlaTier.parse(spec, speed) for spec in specs]


class Provenance(StrictModel):
    command: str
    date: str
    repeats: int
    warmup: int
    host: str
    rounds: int = 1  # passes over the probes (repeats are per probe per pass)
    source: str = "capture"  # SOURCES: in-process capture, over HTTP, or a live server's learned table

    @field_validator("source")
    @classmethod
    def _known_source(cls, source: str) -> str:
        if source not in SOURCES:
            raise ValueError(f"must be one of {', '.join(SOURCES)}, got {source!r}")
        return source


class SlaProfile(StrictModel):
    version: int
    name: str
    fingerprint: Fingerprint
    sps: SpsSection
    sts: StsCalibration | None = None
    sla_tiers: list[SlaTier] = []
    provenance: Provenance

    @model_validator(mode="after")
    def _check(self) -> SlaProfile:
        if self.version != SCHEMA_VERSION:
            raise FieldError("version", f"this release reads version {SCHEMA_VERSION}, got {self.version}")
        if not self.name:
            raise FieldError("name", "must not be empty")
        if self.sts is not None and len(self.sts.temperatures) != self.fingerprint.gamma:
            raise FieldError("sts.temperatures", f"{len(self.sts.temperatures)} temperatures, but fingerprint.gamma "
                             f"is {self.fingerprint.gamma} (one per draft position)")
        seen: set[str] = set()
        for i, tier in enumerate(self.sla_tiers):
            if tier.name in seen:
                raise FieldError(f"sla_tiers[{i}].name", f"duplicate tier name {tier.name!r}")
            seen.add(tier.name)
        return self

    # -- files ------------------------------------------------------------------------------------
    @classmethod
    def from_yaml(cls, text: str | bytes, source: str = "<profile>") -> SlaProfile:
        try:
            raw = yaml.load(text, Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader))
        except yaml.YAMLError as exc:
            raise ProfileError(f"{source}: not valid YAML ({' '.join(str(exc).split())})") from None
        if not isinstance(raw, dict):
            raise ProfileError(f"{source}: expected a YAML mapping at the top level, got {type(raw).__name__}")
        prov = raw.get("provenance")
        if isinstance(prov, dict) and isinstance(prov.get("date"), (_dt.date, _dt.datetime)):
            prov["date"] = _iso(prov["date"])  # an unquoted timestamp is still a date string to us
        return cls.validated(raw, source)

    @classmethod
    def validated(cls, data: dict, source: str = "<profile>") -> SlaProfile:
        """A profile from plain data, or ProfileError naming the field."""
        try:
            return cls.model_validate(data)
        except ValidationError as exc:
            raise ProfileError(f"{source}: {error_line(exc)}") from None

    def replaced(self, **fields) -> SlaProfile:
        """A copy with `fields` replaced, checked like a loaded file (pydantic's model_copy is not)."""
        return self.validated({**self.model_dump(), **{k: _plain(v) for k, v in fields.items()}}, self.name)

    @classmethod
    def load(cls, path: str | Path) -> SlaProfile:
        try:
            text = Path(path).read_bytes()
        except OSError as exc:
            raise ProfileError(f"{path}: cannot read ({exc.strerror or exc})") from None
        return cls.from_yaml(text, str(path))

    def to_yaml(self) -> str:
        data = self.model_dump()
        data["sps"]["measurements"] = [_Flow(m) for m in data["sps"]["measurements"]]
        data["sla_tiers"] = [_Flow(t) for t in data["sla_tiers"]]
        return yaml.dump(data, Dumper=_Dumper, sort_keys=False, allow_unicode=True, width=1 << 16)

    def save(self, path: str | Path) -> None:
        """Write atomically (a reader never sees half a profile)."""
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(path.name + ".tmp")
        tmp.write_text(self.to_yaml())
        os.replace(tmp, path)

    # -- what the engines use ---------------------------------------------------------------------
    def sps_table(self) -> SpsTable:
        return self.sps.table()

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
        raise ProfileError(f"sla_tiers: no tier {name!r} (known: {known})")

    def export_sglang(self, out_dir: str | Path) -> tuple[Path, Path | None]:
        """SGLang JSON for `--speculative-dspark-sps-table-path` (the additive table when present, else
        the cost table) and `--speculative-dspark-confidence-sts-path` (None without STS)."""
        out = Path(out_dir)
        out.mkdir(parents=True, exist_ok=True)
        table = self.sps.additive if self.sps.additive is not None else self.sps.cost
        sps_path = out / SPS_FILE
        sps_path.write_text(table.model_dump_json())
        sts_path = None
        if self.sts is not None:
            sts_path = out / STS_FILE
            sts_path.write_text(self.sts.model_dump_json())
        return sps_path, sts_path

    def summary(self) -> str:
        fp = self.fingerprint
        kind = "additive" if self.sps.additive is not None else f"cost ({len(self.sps.cost.sample_batch_tokens)} probes)"
        tiers = ",".join(t.name for t in self.sla_tiers) or "none"
        return (f"{self.name}: engine={fp.engine} hardware={fp.hardware!r} gamma={fp.gamma} tp={fp.tp} dp={fp.dp} "
                f"sps={kind} measurements={len(self.sps.measurements)} source={self.provenance.source} "
                f"sts={'yes' if self.sts is not None else 'no'} tiers={tiers}")


def _plain(value):
    """A model (or a list of them) as plain data, so `replaced` re-validates every level."""
    if isinstance(value, list):
        return [_plain(v) for v in value]
    return value.model_dump() if hasattr(value, "model_dump") else value


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


def _iso(value) -> str:
    if isinstance(value, _dt.datetime):
        if value.tzinfo is None or value.utcoffset() == _dt.timedelta(0):
            return value.replace(tzinfo=None).isoformat() + "Z"
        return value.isoformat()
    return value.isoformat()


def utc_now() -> str:
    return _dt.datetime.now(_dt.timezone.utc).replace(microsecond=0, tzinfo=None).isoformat() + "Z"
