"""SLA profiles: schema, one-line errors naming the field, round trip, fingerprints, SGLang export, CLI."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from sglang_dspark.core.calibration import StsCalibration
from sglang_dspark.core.sps import SpsAdditiveCostTable, SpsCostTable
from sglang_dspark.profile.cli import main as profile_main
from sglang_dspark.profile.fingerprint import dir_sha256, fingerprint_for, hardware_id, mismatches
from sglang_dspark.profile.schema import (
    Fingerprint,
    Measurement,
    ProfileError,
    Provenance,
    SlaProfile,
    SlaTier,
    SpsSection,
    parse_tiers,
    single_stream_speed,
)

REPO = Path(__file__).resolve().parent.parent


def make_model_dirs(root: Path, gamma: int = 3) -> tuple[Path, Path]:
    """Stand-in target / drafter directories: only config.json and *.safetensors are hashed."""
    target, draft = root / "target", root / "draft"
    target.mkdir(parents=True, exist_ok=True)
    draft.mkdir(parents=True, exist_ok=True)
    (target / "config.json").write_text(json.dumps({"model_type": "llama", "vocab_size": 48}))
    (target / "model.safetensors").write_bytes(b"target-weights")
    (draft / "config.json").write_text(json.dumps({"block_size": gamma, "architectures": ["DSparkDraftModel"],
                                                   "target_layer_ids": [0, 1], "mask_token_id": 0}))
    (draft / "model.safetensors").write_bytes(b"draft-weights")
    return target, draft


def _row(r, b, median, p10, p90, repeats) -> Measurement:
    return Measurement(num_requests=r, batch_tokens=b, median_ms=median, p10_ms=p10, p90_ms=p90, repeats=repeats)


def make_profile(*, gamma: int = 3, engine: str = "reference", target_dir=None, draft_dir=None, additive: bool = False,
                 sts: bool = True, tp: int = 1, dp: int = 1) -> SlaProfile:
    if target_dir is not None:
        fp = fingerprint_for(engine=engine, target_dir=target_dir, draft_dir=draft_dir, gamma=gamma, tp=tp, dp=dp)
    else:
        fp = Fingerprint(engine=engine, hardware="cpu: Test CPU x2", torch="2.14.1", sglang="0.5.23",
                         target_sha256="a" * 64, draft_sha256="b" * 64, gamma=gamma)
    add = SpsAdditiveCostTable(bias_seconds=0.004, bs_probes=[1, 4, 16], alpha_seconds=[0.0, 0.001, 0.003],
                               m_probes=[1, 8, 32, 64], theta_seconds=[0.0, 0.002, 0.006, 0.0125]) if additive else None
    return SlaProfile(
        version=1, name="tiny-dspark-cpu", fingerprint=fp,
        sps=SpsSection(
            cost=SpsCostTable(sample_batch_tokens=[1, 4, 8, 16, 32], sample_steps_per_sec=[95.5, 90.0, 71.25, 50.0, 1 / 0.03],
                              max_batch_tokens=64),
            additive=add,
            draft_skip_seconds=[0.001, 0.002, 0.004] if additive else None,
            measurements=[_row(1, 1, 10.47, 10.1, 11.0, 7), _row(1, 4, 11.1, 10.9, 12.5, 7),
                          _row(4, 8, 14.03, 13.0, 15.2, 7), _row(4, 16, 20.0, 19.5, 21.7, 7)]),
        sts=StsCalibration(temperatures=[1.0, 1.3, 0.7][:gamma] + [1.1] * max(0, gamma - 3), dataset="held-out",
                           num_samples=512, ece_before=[0.05] * gamma, ece_after=[0.01] * gamma) if sts else None,
        sla_tiers=[SlaTier(name="interactive", tok_s_per_user=20.0, ttft_s=2.0, max_concurrency=4),
                   SlaTier(name="batch", tok_s_per_user=5.0, ttft_s=30.0, max_concurrency=16)],
        provenance=Provenance(command="python -m sglang_dspark.profile capture ...", date="2026-11-29T14:00:00Z",
                              repeats=7, warmup=2, host="test-host"))


@pytest.fixture
def good_yaml(tmp_path) -> Path:
    path = tmp_path / "good.yaml"
    make_profile().save(path)
    return path


def _edit(path: Path, old: str, new: str, count: int = 1) -> Path:
    text = path.read_text()
    assert old in text, f"{old!r} not in the profile"
    out = path.with_name("bad.yaml")
    out.write_text(text.replace(old, new, count))
    return out


# -- schema and round trip -----------------------------------------------------------------------
@pytest.mark.parametrize("additive,sts", [(False, True), (True, False)])
def test_round_trip_is_exact(tmp_path, additive, sts):
    profile = make_profile(additive=additive, sts=sts)
    path = tmp_path / "p.yaml"
    profile.save(path)
    loaded = SlaProfile.load(path)
    assert loaded == profile
    loaded.save(tmp_path / "again.yaml")
    assert (tmp_path / "again.yaml").read_text() == path.read_text()
    text = path.read_text()  # human-readable: block mappings, one line per measurement row
    assert "fingerprint:\n  engine: reference\n" in text and "- {num_requests: 1, batch_tokens: 1," in text


def test_accessors():
    profile = make_profile(additive=True)
    assert profile.sps_table().table == profile.sps.additive  # additive wins: it models per-request cost
    assert make_profile().sps_table().table == make_profile().sps.cost
    assert torch.equal(profile.sts_temperatures(), torch.tensor([1.0, 1.3, 0.7]))
    assert make_profile(sts=False).sts_temperatures() is None
    assert profile.tier("batch").max_concurrency == 16
    with pytest.raises(ProfileError, match=r"no tier 'gold' \(known: interactive, batch\)"):
        profile.tier("gold")



def test_a_tier_relative_to_the_tables_single_stream_speed():
    table = make_profile(additive=True).sps_table()
    alone = 1.0 / float(table.seconds_at(1, 1, False))
    assert single_stream_speed(table) == pytest.approx(alone, rel=1e-12)
    half, fixed = parse_tiers(["interactive:x0.5:2:4", "batch:7:10:16"], table)
    assert half == SlaTier(name="interactive", tok_s_per_user=round(0.5 * alone, 1), ttft_s=2.0, max_concurrency=4)
    assert fixed.tok_s_per_user == 7.0
    with pytest.raises(ProfileError, match=r"^--tier a:x0.5:2:4: a relative speed \(xF\) needs"):
        SlaTier.parse("a:x0.5:2:4")
    for bad in ("a:x:2:4", "a:x-1:2:4", "a:xx2:2:4"):
        with pytest.raises(ProfileError, match=f"^--tier {bad}: "):
            parse_tiers([bad])  # checked before a capture starts

BAD_EDITS = [
    # (old, new, words the one-line reason must contain)
    ("  gamma: 3\n", "", "fingerprint.gamma"),  # missing -> default 0 -> refused by gamma >= 1
    ("name: tiny-dspark-cpu\n", "", "name: missing required field"),
    ("  tp: 1\n", "  tp: one\n", "fingerprint.tp: Input should be a valid integer, got str 'one'"),
    ("  gamma: 3\n", "  gamma: '3'\n", "fingerprint.gamma: Input should be a valid integer, got str '3'"),
    ("[1, 4, 8, 16, 32]", "[1, 8, 4, 16, 32]", "sps.cost.sample_batch_tokens"),
    ("sample_steps_per_sec: [95.5,", "sample_steps_per_sec: [-95.5,", "sps.cost.sample_steps_per_sec"),
    ("temperatures: [1.0, 1.3, 0.7]", "temperatures: [1.0, 1.3]", "sts.temperatures: 2 temperatures, but fingerprint.gamma is 3"),
    ("version: 1", "version: 2", "version"),
    ("{num_requests: 4, batch_tokens: 16,", "{num_requests: 1, batch_tokens: 16,", "sps.measurements[3]"),
    ("tok_s_per_user: 20.0", "tok_s_per_user: 0.0", "sla_tiers[0].tok_s_per_user: must be > 0"),
    ("max_concurrency: 16", "max_concurrency: 0", "sla_tiers[1].max_concurrency"),
    ("name: batch", "name: interactive", "sla_tiers[1].name: duplicate"),
    ("  engine: reference\n", "  engine: vllm\n", "fingerprint.engine"),
    ("  host: test-host\n", "  host: test-host\n  hostname: x\n", "provenance.hostname: unknown field"),
    ("  dataset: held-out\n", "  datset: held-out\n", "sts.datset: unknown field"),
    ("repeats: 7}", "repeats: 7, p50_ms: 1.0}", "sps.measurements[0].p50_ms: unknown field"),
    ("sps:\n", "sps: [\n", "not valid YAML"),
]


@pytest.mark.parametrize("old,new,reason", BAD_EDITS, ids=[r for *_, r in BAD_EDITS])
def test_bad_profile_is_refused_with_the_field_named(good_yaml, old, new, reason):
    bad = _edit(good_yaml, old, new)
    with pytest.raises(ProfileError) as exc:
        SlaProfile.load(bad)
    message = str(exc.value)
    assert message.startswith(f"{bad}: ") and reason in message and "\n" not in message


def test_unquoted_timestamp_is_still_a_date(good_yaml):
    bad = _edit(good_yaml, "date: '2026-11-29T14:00:00Z'", "date: 2026-11-29T14:00:00Z")
    assert SlaProfile.load(bad).provenance.date == "2026-11-29T14:00:00Z"


def test_draft_skip_prices_budget_zero_without_the_drafter():
    profile = make_profile(additive=True)
    table = profile.sps_table()
    seconds = table.step_seconds(4, 3)
    assert seconds[0] == pytest.approx(1.0 / table(4, num_requests=4) - 0.002, rel=1e-12)
    assert seconds[1] == pytest.approx(1.0 / table(5, num_requests=4), rel=1e-12)  # drafted steps unchanged
    assert 1.0 / table(4, num_requests=4, drafted=False) == pytest.approx(seconds[0], rel=1e-12)
    assert table.draft_skip(10) == pytest.approx(0.002 + 6 / 12 * 0.002)  # interpolated over bs_probes


ONE = {"sample_batch_tokens": [1], "sample_steps_per_sec": [1.0], "max_batch_tokens": 1}


def test_construction_validates_too():
    with pytest.raises(ValueError, match="gamma"):
        Fingerprint(engine="reference", hardware="x", torch="t", sglang=None, target_sha256="a", draft_sha256=None)
    with pytest.raises(ValueError, match="measurements"):
        SpsSection(cost=ONE, measurements=[_row(2, 2, 1, 1, 1, 1), _row(1, 1, 1, 1, 1, 1)])
    with pytest.raises(ValueError, match="draft_skip_seconds: needs sps.additive"):
        SpsSection(cost=ONE, draft_skip_seconds=[0.0])
    add = make_profile(additive=True).sps.additive
    with pytest.raises(ValueError, match="draft_skip_seconds: 2 values for 3"):
        SpsSection(cost=ONE, additive=add, draft_skip_seconds=[0.0, 0.1])
    with pytest.raises(ValueError, match=">= 0"):
        SpsSection(cost=ONE, additive=add, draft_skip_seconds=[0.0, -0.1, 0.0])


# -- fingerprints ----------------------------------------------------------------------------------
def test_hardware_id_and_dir_hash(tmp_path):
    hw = hardware_id()
    assert hw.startswith(("cpu: ", "cuda: ")) and hw.rsplit(" x", 1)[1].isdigit()
    target, _ = make_model_dirs(tmp_path)
    first = dir_sha256(target)
    (target / "tokenizer.json").write_text("{}")  # not hashed: only config.json and *.safetensors
    assert dir_sha256(target) == first
    (target / "model.safetensors").write_bytes(b"other-weights")
    assert dir_sha256(target) != first
    second = dir_sha256(target)
    (target / "draft_vocab.pt").write_bytes(b"hot-ids")  # a drafter's hot vocabulary is hashed too
    assert dir_sha256(target) != second
    with pytest.raises(ProfileError, match="not a local directory"):
        dir_sha256(tmp_path / "missing")


def test_fingerprint_mismatches_name_every_difference(tmp_path):
    target, draft = make_model_dirs(tmp_path)
    fp = fingerprint_for(engine="reference", target_dir=target, draft_dir=draft, gamma=3)
    assert mismatches(fp, fp) == []
    other = fp.model_copy(update=dict(gamma=5, hardware="cuda: H200 x1", torch="9.9.9", target_sha256="c" * 64))
    lines = mismatches(fp, other)
    assert lines[0].startswith("hardware: profile 'cpu: ") and lines[0].endswith("actual 'cuda: H200 x1'")
    assert "target_sha256: profile" in lines[1] and "gamma: profile 3, actual 5" in lines
    assert lines[-1] == f"version torch: profile {fp.torch!r}, actual '9.9.9'"


# -- SGLang export ---------------------------------------------------------------------------------
@pytest.mark.sglang
@pytest.mark.parametrize("additive", [False, True])
def test_export_loads_in_sglang_with_identical_lookups(tmp_path, additive):
    from sglang.srt.speculative.dspark_components.dspark_sps import (
        SpsAdditiveCostTable as SgAdditive,
    )
    from sglang.srt.speculative.dspark_components.dspark_sps import load_sps_table_from_path
    from sglang.srt.speculative.dspark_components.dspark_sts import load_sts_calibration_from_path

    profile = make_profile(additive=additive)
    sps_path, sts_path = profile.export_sglang(tmp_path / "out")
    theirs = load_sps_table_from_path(str(sps_path))
    assert isinstance(theirs, SgAdditive) == additive
    ours = profile.sps_table()
    for num_requests in (1, 2, 4, 7, 16, 40):
        for batch_tokens in range(num_requests, num_requests * 4 + 1):
            if additive:
                want = theirs.step_time(num_reqs=num_requests, budget=batch_tokens - num_requests)
                assert 1.0 / ours(batch_tokens, num_requests=num_requests) == pytest.approx(want, rel=1e-12, abs=0)
            else:
                assert ours(batch_tokens, num_requests=num_requests) == theirs.lookup(batch_tokens)
    sts = load_sts_calibration_from_path(str(sts_path))
    assert sts.temperatures == profile.sts.temperatures and sts.num_samples == 512


# -- CLI -----------------------------------------------------------------------------------------
def _cli(*args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    return subprocess.run([sys.executable, "-m", "sglang_dspark.profile", *args], capture_output=True, text=True,
                          timeout=180, cwd=REPO, env=env)


def test_cli_validate_subprocess(tmp_path, good_yaml):
    """One subprocess for the good file and one for a bad one: the module path, exit codes, stderr."""
    ok = _cli("validate", str(good_yaml))
    assert ok.returncode == 0, ok.stderr
    assert ok.stdout.count("\n") == 1 and ok.stdout.startswith(f"ok {good_yaml}: tiny-dspark-cpu")
    bad = _cli("validate", str(_edit(good_yaml, "  gamma: 3\n", "  gamma: x\n")))
    err = bad.stderr.strip()
    assert bad.returncode == 2 and bad.stdout == ""
    assert err == f"error: {tmp_path / 'bad.yaml'}: fingerprint.gamma: Input should be a valid integer, got str 'x'"


@pytest.mark.parametrize("old,new,reason", [e for e in BAD_EDITS if "YAML" not in e[2]][:6])
def test_cli_validate_refuses_bad_files(good_yaml, capsys, old, new, reason):
    rc = profile_main(["validate", str(_edit(good_yaml, old, new))])
    err = capsys.readouterr().err.strip()
    assert rc == 2 and err.startswith("error: ") and reason in err and "\n" not in err


def test_cli_validate_fingerprint(tmp_path, capsys):
    target, draft = make_model_dirs(tmp_path, gamma=3)
    path = tmp_path / "fp.yaml"
    make_profile(target_dir=target, draft_dir=draft).save(path)
    assert profile_main(["validate", str(path), "--model", str(target), "--draft", str(draft)]) == 0
    assert "fingerprint matches" in capsys.readouterr().out

    other_target, other_draft = make_model_dirs(tmp_path / "other", gamma=5)
    (other_target / "model.safetensors").write_bytes(b"different")
    rc = profile_main(["validate", str(path), "--model", str(other_target), "--draft", str(other_draft)])
    err = capsys.readouterr().err.strip()
    assert rc == 2 and "\n" not in err and "fingerprint does not match" in err
    assert "target_sha256: profile" in err and "gamma: profile 3, actual 5" in err
    assert "draft_sha256" in err  # the drafter config differs too

    rc = profile_main(["validate", str(path), "--model", str(target), "--engine", "sglang"])
    assert rc == 2 and "engine: profile 'reference', actual 'sglang'" in capsys.readouterr().err


def test_cli_export(tmp_path, good_yaml, capsys):
    assert profile_main(["export", str(good_yaml), "--out", str(tmp_path / "sg")]) == 0
    out = capsys.readouterr().out
    assert "--speculative-dspark-sps-table-path" in out and "--speculative-dspark-confidence-sts-path" in out
    assert json.loads((tmp_path / "sg" / "sps_table.json").read_text())["max_batch_tokens"] == 64
    assert profile_main(["export", str(tmp_path / "nope.yaml"), "--out", str(tmp_path)]) == 2
    assert "cannot read" in capsys.readouterr().err


def test_cli_refit_rederives_the_tables_from_the_measurements(tmp_path, good_yaml, capsys):
    from sglang_dspark.profile.cli import main

    out = tmp_path / "refit.yaml"
    assert main(["refit", str(good_yaml), "--out", str(out)]) == 0
    assert "refitted" in capsys.readouterr().out and out.with_suffix(".png").is_file()
    before, after = SlaProfile.load(good_yaml), SlaProfile.load(out)
    assert after.sps.additive is not None and after.sps.draft_skip_seconds is not None
    assert after.sps.measurements == before.sps.measurements and after.fingerprint == before.fingerprint
    assert after.sps.cost.sample_batch_tokens == [1, 4, 8, 16]  # one entry per measured B
    # The values, from the measured medians (10.47, 11.1, 14.03, 20.0 ms): SPS = 1000 / ms, and the
    # additive table prices every measured step at its median (4 points, as many free parameters).
    assert after.sps.cost.sample_steps_per_sec == pytest.approx([1000 / 10.47, 1000 / 11.1, 1000 / 14.03, 50.0], rel=1e-6)
    table = after.sps_table()
    for r, b, ms in [(1, 1, 10.47), (1, 4, 11.1), (4, 8, 14.03), (4, 16, 20.0)]:
        assert 1e3 / table(b, num_requests=r, drafted=b > r) == pytest.approx(ms, rel=1e-3), (r, b)
    empty = tmp_path / "empty.yaml"
    before.model_copy(update={"sps": before.sps.model_copy(update={"measurements": []})}).save(empty)
    assert main(["refit", str(empty)]) == 2
    assert "sps.measurements: empty" in capsys.readouterr().err


def test_every_cli_flag_has_help():
    from sglang_dspark.profile.cli import build_parser

    parser = build_parser()
    sub = next(a for a in parser._actions if a.__class__.__name__ == "_SubParsersAction")
    assert {"validate", "export", "capture-http"} <= set(sub.choices)
    for name, p in sub.choices.items():
        for action in p._actions:
            if action.dest != "help":
                assert action.help, f"{name} {action.dest} has no help"


def test_cli_set_sts_embeds_checks_and_clears(tmp_path, good_yaml, capsys):
    from sglang_dspark.core.calibration import StsCalibration
    from sglang_dspark.profile.cli import main

    gamma = SlaProfile.load(good_yaml).fingerprint.gamma
    sts = tmp_path / "sts.json"
    StsCalibration(temperatures=[1.5] * gamma, dataset="calib", num_samples=10).save(sts)
    out = tmp_path / "with_sts.yaml"
    assert main(["set-sts", str(good_yaml), "--sts", str(sts), "--out", str(out)]) == 0
    loaded = SlaProfile.load(out)
    assert loaded.sts.temperatures == [1.5] * gamma and loaded.sts_temperatures().tolist() == [1.5] * gamma
    assert loaded.sps == SlaProfile.load(good_yaml).sps  # nothing else changes
    # One temperature too many: refused with the field named, and the profile is left as it was.
    StsCalibration(temperatures=[1.5] * (gamma + 1)).save(sts)
    before = out.read_bytes()
    assert main(["set-sts", str(out), "--sts", str(sts)]) == 2
    assert "sts.temperatures" in capsys.readouterr().err and out.read_bytes() == before
    assert main(["set-sts", str(out), "--clear"]) == 0 and SlaProfile.load(out).sts is None



def test_cli_set_tiers_resolves_relative_tiers_on_the_profiles_table(tmp_path, good_yaml, capsys):
    from sglang_dspark.profile.cli import main

    out = tmp_path / "tiers.yaml"
    assert main(["set-tiers", str(good_yaml), "--tier", "interactive:x0.5:2:4", "--tier", "bulk:3:10:16",
                 "--out", str(out)]) == 0
    loaded, before = SlaProfile.load(out), SlaProfile.load(good_yaml)
    alone = single_stream_speed(before.sps_table())
    assert [(t.name, t.tok_s_per_user, t.max_concurrency) for t in loaded.sla_tiers] == [
        ("interactive", round(0.5 * alone, 1), 4), ("bulk", 3.0, 16)]
    assert loaded.sps == before.sps and loaded.sts == before.sts  # nothing else changes
    capsys.readouterr()
    snapshot = out.read_bytes()
    assert main(["set-tiers", str(out), "--tier", "a:x0.5:2:4", "--tier", "a:1:2:4"]) == 2  # duplicate name
    assert "sla_tiers[1].name: duplicate" in capsys.readouterr().err and out.read_bytes() == snapshot


@pytest.mark.parametrize("path", sorted((REPO / "sla_profiles").glob("*.yaml")), ids=lambda p: p.stem)
def test_a_shipped_interactive_tier_binds(path):
    """SLA mode must mean something on every shipped profile: at some batch size within the tier,
    where throughput mode would verify the confident requests' drafts and slow the one that is not
    below the tier, SLA mode verifies fewer. A tier set below what a plain step already gives every
    user (the old fixed 12 tok/s) never binds."""
    from sglang_dspark.core.schedule import decide_budget, decide_budget_sla

    profile = SlaProfile.load(path)
    table, gamma, tier = profile.sps_table(), profile.fingerprint.gamma, profile.tier("interactive")
    smaller = []
    for r in range(2, tier.max_concurrency + 1):
        conf = torch.cat([torch.full((r - 1, gamma), 0.9), torch.full((1, gamma), 0.05)])
        survival = torch.cumprod(conf, dim=1)
        throughput = decide_budget(survival, table).budget
        sla = decide_budget_sla(survival, table, tier.tok_s_per_user).budget
        assert sla <= throughput
        smaller.append(sla < throughput)
    assert any(smaller), f"{path.name}: the interactive tier ({tier.tok_s_per_user} tok/s/user) never binds"

# -- CLI errors: one line on stderr, exit 2, naming the flag and the file ------------------------------
def _one_line_error(argv: list[str], capsys) -> str:
    try:
        rc = profile_main(argv)
    except SystemExit as exc:  # argparse's own errors
        rc = exc.code
    captured = capsys.readouterr()
    err = captured.err.strip()
    assert rc == 2 and err.startswith("error: ") and "\n" not in err, (rc, captured.err)
    assert "Errno" not in err and "pydantic.dev" not in err and "usage:" not in err, err
    return err


def test_cli_errors_name_the_flag_and_the_file(tmp_path, good_yaml, capsys):
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    err = _one_line_error(["export", str(good_yaml), "--out", str(blocker / "sub")], capsys)
    assert err.startswith(f"error: --out {blocker / 'sub'}: cannot write (")
    err = _one_line_error(["set-sts", str(good_yaml), "--sts", str(tmp_path / "missing.json")], capsys)
    assert err == f"error: --sts {tmp_path / 'missing.json'}: cannot read (No such file or directory)"
    err = _one_line_error(["set-sts", str(good_yaml), "--sts", str(REPO / "README.md")], capsys)
    assert err.startswith(f"error: --sts {REPO / 'README.md'}: not an STS calibration JSON: Invalid JSON")
    err = _one_line_error(["validate", str(good_yaml), "--model", str(tmp_path / "nonexistent")], capsys)
    assert err.startswith(f"error: --model {tmp_path / 'nonexistent'}: no such directory")
    err = _one_line_error(["validate", str(good_yaml), "--draft", str(blocker)], capsys)
    assert err == f"error: --draft {blocker}: not a directory"


def test_cli_usage_errors_are_one_line(capsys):
    assert "the following arguments are required: FILE" in _one_line_error(["validate"], capsys)
    assert "invalid choice: 'nope'" in _one_line_error(["nope"], capsys)
    assert "--requests: expected comma-separated int" in _one_line_error(
        ["capture", "--model", "m", "--out", "x.yaml", "--requests", "1,x"], capsys)


@pytest.mark.parametrize("flag, value, minimum", [("--points", "1", 2), ("--warmup", "-1", 0), ("--repeats", "0", 1),
                                                  ("--rounds", "0", 1), ("--prompt-tokens", "0", 1)])
def test_cli_capture_refuses_counts_out_of_range(tmp_path, capsys, flag, value, minimum):
    """Checked before the model is resolved or loaded (--prompt-tokens 0 used to mean the whole prompt)."""
    err = _one_line_error(["capture", "--model", str(tmp_path / "no-model"), "--out", str(tmp_path / "x.yaml"),
                           flag, value], capsys)
    assert err == f"error: {flag} {value}: must be >= {minimum}"


def test_cli_validate_engine_alone_compares_only_the_engine(tmp_path, capsys):
    """`--engine` without --model / --draft checks the profile's engine, not this machine: the
    profile below was measured on another CPU with other library versions."""
    path = tmp_path / "elsewhere.yaml"
    make_profile(engine="sglang").save(path)
    assert SlaProfile.load(path).fingerprint.hardware != hardware_id()
    assert profile_main(["validate", str(path), "--engine", "sglang"]) == 0
    assert "(engine sglang matches)" in capsys.readouterr().out
    err = _one_line_error(["validate", str(path), "--engine", "reference"], capsys)
    assert err == f"error: {path}: fingerprint does not match: engine: profile 'sglang', actual 'reference'"
