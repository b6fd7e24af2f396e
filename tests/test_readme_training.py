"""README's "Training a drafter": every command of its bash block parses with the flags of the
program it names (a renamed or removed flag fails here, not in a user's terminal)."""

from __future__ import annotations

import importlib
import shlex
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PROGRAMS = {"sglang_dspark.train": "sglang_dspark.train.__main__", "sglang_dspark.train.self_distill": None,
            "sglang_dspark.train.build_data": None, "benchmarks/drafter_pilot.py": "drafter_pilot"}


def section_commands() -> list[list[str]]:
    text = (ROOT / "README.md").read_text()
    body = text.split("## Training a drafter", 1)[1].split("\n## ", 1)[0]
    block = body.split("```bash", 1)[1].split("```", 1)[0]
    lines = [line for line in block.replace("\\\n", " ").splitlines() if line.strip() and not line.startswith("#")]
    return [shlex.split(line.replace("$M", "/tmp/model")) for line in lines if line.startswith("python")]


def test_the_section_has_its_four_steps():
    names = [words[2] if words[1] == "-m" else words[1] for words in section_commands()]
    assert set(names) == set(PROGRAMS), names


@pytest.mark.parametrize("words", section_commands(), ids=lambda w: w[2] if w[1] == "-m" else w[1])
def test_each_command_parses_with_its_programs_flags(words):
    if words[1] == "-m":
        name, argv = words[2], words[3:]
    else:
        name, argv = words[1], words[2:]
        sys.path.insert(0, str(ROOT / "benchmarks"))
    module = importlib.import_module(PROGRAMS[name] or name)
    parsed = module.build_parser().parse_args(argv)  # argparse exits 2 on an unknown flag or a bad value
    # and each flag is written out in full (argparse also takes an abbreviation, which a new flag can break)
    flags = [a[2:].replace("-", "_") for a in argv if a.startswith("--")]
    assert all(hasattr(parsed, f) for f in flags), [f for f in flags if not hasattr(parsed, f)]
