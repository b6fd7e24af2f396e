"""benchmarks/train_drafter.py: evaluating a trained drafter never overwrites the shipped drafter's
STS file; shipping copies the drafter and its STS together; `train` runs both drafters or the one
named, sharing the host's cores."""

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
import train_drafter  # noqa: E402


def test_evaluating_the_trained_drafter_writes_its_own_sts_file():
    cmd = [str(x) for x in train_drafter.eval_command("dspark", 64, "mt-bench:5", 96)]
    sts_out = cmd[cmd.index("--sts-out") + 1]
    assert sts_out == str(train_drafter.STS_TRAINED)
    assert sts_out != str(train_drafter.STS_SHIPPED)
    for other in ("dflash", "previous"):
        assert "--sts-out" not in [str(x) for x in train_drafter.eval_command(other, 64, "mt-bench:5", 96)]


def test_ship_copies_the_drafter_and_its_sts_and_keeps_the_previous_drafter(tmp_path, monkeypatch):
    trained, shipped, previous = tmp_path / "trained", tmp_path / "shipped", tmp_path / "previous"
    for d, tag in ((trained, "new"), (shipped, "old")):
        d.mkdir()
        for name in train_drafter.SHIPPED_FILES:
            (d / name).write_text(f"{tag} {name}")
    (tmp_path / "sts_new.json").write_text("new sts")
    (tmp_path / "sts_shipped.json").write_text("old sts")
    monkeypatch.setattr(train_drafter, "TRAINED", {"dspark": trained})
    monkeypatch.setattr(train_drafter, "SHIPPED", shipped)
    monkeypatch.setattr(train_drafter, "PREVIOUS", previous)
    monkeypatch.setattr(train_drafter, "STS_TRAINED", tmp_path / "sts_new.json")
    monkeypatch.setattr(train_drafter, "STS_SHIPPED", tmp_path / "sts_shipped.json")
    train_drafter.ship()
    assert all((shipped / n).read_text() == f"new {n}" for n in train_drafter.SHIPPED_FILES)
    assert all((previous / n).read_text() == f"old {n}" for n in train_drafter.SHIPPED_FILES)
    assert (tmp_path / "sts_shipped.json").read_text() == "new sts"


def _flag(cmd, name):
    cmd = [str(x) for x in cmd]
    return [cmd[i + 1] for i, x in enumerate(cmd) if x == name]


def test_train_runs_both_drafters_on_a_core_each_or_one_on_both():
    both = train_drafter.train_commands(10, 2)
    assert set(both) == {"train-dspark", "train-dflash"}
    assert [_flag(c, "--threads") for c in both.values()] == [["1"], ["1"]]
    assert _flag(both["train-dflash"], "--markov-rank") == ["0"]
    assert _flag(both["train-dspark"], "--markov-rank") == [str(train_drafter.ARCH["markov-rank"])]
    alone = train_drafter.train_commands(10, 2, only="dspark")
    # exactly one --threads per command: a second one that argparse lets win is the bug fixed before
    assert list(alone) == ["train-dspark"] and _flag(alone["train-dspark"], "--threads") == ["2"]
    assert _flag(train_drafter.train_commands(10, 2, only="dspark", threads=3)["train-dspark"], "--threads") == ["3"]


def test_train_refuses_an_unknown_run():
    with pytest.raises(ValueError, match="unknown run"):
        train_drafter.train_commands(10, 2, only="dspark,eagle")
    with pytest.raises(ValueError, match="at least 1"):
        train_drafter.train_commands(10, 2, only="dspark", threads=0)
