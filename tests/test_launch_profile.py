"""launch --profile: one SLA profile YAML, fingerprint-checked, refused in one line when it does not fit."""

from __future__ import annotations

import logging

import pytest

from sglang_dspark import launch
from test_profiles import BAD_EDITS, make_model_dirs, make_profile


@pytest.fixture
def setup(tmp_path):
    target, draft = make_model_dirs(tmp_path, gamma=3)
    path = tmp_path / "profile.yaml"
    make_profile(engine="reference", target_dir=target, draft_dir=draft).save(path)
    return target, draft, path


def _launch(target, draft, *extra):
    return launch.main(["--model", str(target), "--draft", str(draft), "--engine", "reference", "--dry-run", *extra])


def test_matching_profile_and_tier(setup, capsys):
    target, draft, path = setup
    assert _launch(target, draft, "--profile", str(path), "--sla-tier", "interactive") == 0
    out = capsys.readouterr().out
    assert f"profile={path} (tiny-dspark-cpu) tier=interactive (20.0 tok/s/user)" in out and "FORCED" not in out
    assert "max_running=4 " in out  # the tier's concurrency limit
    assert _launch(target, draft, "--profile", str(path), "--sla-tier", "batch", "--max-running", "8") == 0
    assert "max_running=8 " in capsys.readouterr().out  # below the batch tier's limit of 16: kept


def _one_line_error(capsys) -> str:
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: ") and "\n" not in err
    return err


@pytest.mark.parametrize("old,new,reason", [e for e in BAD_EDITS if e[2] in (
    "name: missing required field", "fingerprint.gamma: Input should be a valid integer, got str '3'",
    "sps.cost.sample_batch_tokens",
    "sts.temperatures: 2 temperatures, but fingerprint.gamma is 3")])
def test_bad_profile_is_refused(setup, capsys, old, new, reason):
    target, draft, path = setup
    bad = path.with_name("bad.yaml")
    text = path.read_text()
    assert old in text
    bad.write_text(text.replace(old, new, 1))
    assert _launch(target, draft, "--profile", str(bad)) == 2
    err = _one_line_error(capsys)
    assert err.startswith(f"error: {bad}: ") and reason in err


def test_unknown_tier_is_refused(setup, capsys):
    target, draft, path = setup
    assert _launch(target, draft, "--profile", str(path), "--sla-tier", "gold") == 2
    assert _one_line_error(capsys) == f"error: {path}: --sla-tier gold: sla_tiers: no tier 'gold' (known: interactive, batch)"


def test_mismatched_fingerprint_is_refused_unless_forced(setup, tmp_path, capsys, caplog):
    target, _, path = setup
    _, other_draft = make_model_dirs(tmp_path / "other", gamma=5)  # another drafter, gamma 5
    assert _launch(target, other_draft, "--profile", str(path)) == 2
    err = _one_line_error(capsys)
    assert "fingerprint does not match" in err and "--force-profile" in err
    assert "draft_sha256: profile" in err and "gamma: profile 3, actual 5" in err and "target_sha256" not in err

    with caplog.at_level(logging.WARNING):
        assert _launch(target, other_draft, "--profile", str(path), "--force-profile") == 0
    assert "FORCED despite: draft_sha256" in capsys.readouterr().out
    assert any("used anyway" in r.getMessage() and "gamma: profile 3, actual 5" in r.getMessage()
               for r in caplog.records)


def test_profile_for_another_engine_or_machine_is_refused(setup, tmp_path, capsys):
    target, draft, _ = setup
    sglang_profile = tmp_path / "sglang.yaml"
    make_profile(engine="sglang", target_dir=target, draft_dir=draft).save(sglang_profile)
    assert _launch(target, draft, "--profile", str(sglang_profile)) == 2
    assert "engine: profile 'sglang', actual 'reference'" in _one_line_error(capsys)

    foreign = tmp_path / "foreign.yaml"
    make_profile(target_dir=None).save(foreign)  # hashes, hardware and versions of somewhere else
    assert _launch(target, draft, "--profile", str(foreign)) == 2
    err = _one_line_error(capsys)
    assert "hardware: profile 'cpu: Test CPU x2'" in err and "target_sha256" in err


def test_launch_hands_the_profile_tables_and_tier_to_the_engine(monkeypatch, setup):
    """Without --dry-run: the engine gets the profile's SPS table and STS temperatures, and SLA mode
    the tier's tok/s; the server gets the keys. (Engine and server are stand-ins here.)"""
    import torch

    captured = {}

    def fake_build_engine(model_dir, draft_dir, *, config, sps, sts, model_name, **_):
        captured.update(config=config, sps=sps, sts=sts, name=model_name)
        return object()

    monkeypatch.setattr("sglang_dspark.engine.factory.build_engine", fake_build_engine)
    monkeypatch.setattr("sglang_dspark.engine.async_engine.AsyncEngine.built_on_its_thread", lambda build: build())
    monkeypatch.setattr("sglang_dspark.server.create_app",
                        lambda client, **kw: captured.update(app=kw) or object())
    monkeypatch.setattr("sglang_dspark.server.serve", lambda *a, **k: None)
    target, draft, path = setup
    assert launch.main(["--model", str(target), "--draft", str(draft), "--engine", "reference", "--profile",
                        str(path), "--sla-tier", "interactive", "--api-key", "k", "--admin-api-key", "a"]) == 0
    profile = make_profile()
    assert captured["sps"].table == profile.sps.cost
    assert torch.equal(captured["sts"], torch.tensor([1.0, 1.3, 0.7]))
    assert captured["config"].sla_tok_s_per_user == 20.0 and captured["config"].max_running == 4
    assert captured["name"] == "target"  # the directory's base name
    assert captured["app"] == {"served_model_name": "target", "api_key": "k", "admin_api_key": "a", "tool_call_parser": None}


def test_a_seed_is_taken_in_the_launchs_weight_format_first(setup, tmp_path, monkeypatch, caplog):
    """Shipped profiles from other hardware in two formats: the seed is the one in the format this
    launch runs, whatever their file order (`...-int4.yaml` sorts before `....yaml`)."""
    target, draft, _ = setup
    shipped = tmp_path / "shipped"
    shipped.mkdir()
    base = make_profile(engine="reference", target_dir=target, draft_dir=draft)
    for suffix, fmt in (("-int4", "int4"), ("", "float32")):
        fp = base.fingerprint.model_copy(update={"hardware": "cpu: Elsewhere x64", "weight_format": fmt})
        base.replaced(fingerprint=fp, name=f"tiny-cpu-elsewhere{suffix}").save(shipped / f"tiny-cpu-elsewhere{suffix}.yaml")
    monkeypatch.setattr(launch, "resolve_model", lambda model, engine, cache_dir, materialise: (str(target), "tiny"))
    monkeypatch.setattr(launch.zoo, "SHIPPED_PROFILES", shipped)
    for dtype, expected in (("float32", "tiny-cpu-elsewhere.yaml"), ("int4", "tiny-cpu-elsewhere-int4.yaml")):
        caplog.clear()
        with caplog.at_level("INFO", logger="sglang_dspark.launch"):
            assert launch.main(["--model", "tiny", "--draft", str(draft), "--engine", "reference", "--dry-run",
                                "--dtype", dtype]) == 0
        (line,) = [r.getMessage() for r in caplog.records if r.getMessage().startswith("profile (shipped)")]
        assert f"{shipped / expected} " in line, line


def test_a_zoo_models_shipped_profile_serves_sla_tier_even_as_a_seed(setup, tmp_path, monkeypatch, capsys):
    """A zoo model out of the box: the shipped profile, measured on other hardware, seeds the
    learned table, and its tiers are what --sla-tier names."""
    target, draft, _ = setup
    shipped = tmp_path / "shipped"
    shipped.mkdir()
    foreign = make_profile(engine="reference", target_dir=target, draft_dir=draft)
    foreign.replaced(fingerprint=foreign.fingerprint.model_copy(update={"hardware": "cpu: Elsewhere x64"})).save(
        shipped / "tiny-cpu.yaml")
    monkeypatch.setattr(launch, "resolve_model", lambda model, engine, cache_dir, materialise: (str(target), "tiny"))
    monkeypatch.setattr(launch.zoo, "SHIPPED_PROFILES", shipped)
    assert launch.main(["--model", "tiny", "--draft", str(draft), "--engine", "reference", "--dry-run",
                        "--sla-tier", "interactive"]) == 0
    out = capsys.readouterr().out
    assert "tier=interactive (20.0 tok/s/user)" in out and "max_running=4 " in out
    assert launch.main(["--model", "tiny", "--draft", str(draft), "--engine", "reference", "--dry-run",
                        "--sla-tier", "interactive", "--sps-learning", "off"]) == 2  # a seed is not a table
    assert "--sla-tier needs --profile" in _one_line_error(capsys)
