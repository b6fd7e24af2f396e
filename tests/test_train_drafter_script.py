"""benchmarks/train_drafter.py: evaluating a trained drafter never overwrites the shipped drafter's
STS file; shipping copies the drafter and its STS together."""

import sys
from pathlib import Path

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
